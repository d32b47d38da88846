"""The Hub path every real upload takes: Git LFS to a second origin, through the client's hooks.

Against the Hub emulator answering as the Hub does (`*.safetensors` files are LFS: preupload,
the LFS batch API, a PUT to a signed URL on the storage origin, verify, then the commit; a
download is a 302 to the storage), this file holds the client to what issue 18 asks:

- the default environment (hf_xet installed, no HF_HUB_DISABLE_XET) takes the LFS path, not
  Xet's, and no request of an upload or download bypasses the session hooks: the client's own
  count of API calls and storage requests equals what the emulator's two origins logged;
- each fault on each step and origin (5xx, 429 with the rate-limit headers, a dropped
  connection, an answer cut short or too slow, an answer lost after the request took effect)
  is retried by the client's policy alone, and the file lands exactly once; the library's
  `RuntimeError` around a failed upload step is classified by its cause and retried;
- the Hub's 401 and 403 at any step are permanent (one line, no retry); the storage's are not
  (the next attempt gets a fresh signed URL);
- what each operation costs (`budget.REQUESTS`) is what it costs against the emulator;
- the master's `start()` survives a transient storage failure.
Backoff sleeps go to a list; the library never sleeps (`library_sleeps`).
"""

# The environment must be set before huggingface_hub is imported, hence:
# ruff: noqa: E402
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_home_"))
os.environ.pop("HF_HUB_OFFLINE", None)

import httpx2
import pytest
from hub_emulator import HubEmulator

from speedtronic.distributed.hub.cadence import REQUESTS
from speedtronic.distributed.hub.transport import HubTransport
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, delta_path
from speedtronic.hub.client import HubClient
from speedtronic.hub.errors import HubError, Transient
from speedtronic.hub.session import NetworkFailure
from speedtronic.hub.wording import Op

pytestmark = [pytest.mark.hub, pytest.mark.usefixtures("library_sleeps")]

TOKEN = "hf_LfsWriterToken0123456789abcdef"
REPO = "alice/run"
DELTA = delta_path("node-b", 1)
DATA = bytes(range(256)) * 12  # 3 KB, binary: LFS twice over (*.safetensors, a NUL byte)
ROOT = Path(__file__).resolve().parents[2]
REAL_SLEEP = time.sleep


@pytest.fixture
def emu():
    with HubEmulator({TOKEN: "alice", "hf_lfs_reader": "alice"}) as hub:
        hub.readonly("hf_lfs_reader")
        hub.create_repo(REPO, private=True)
        yield hub


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make(emu, sleeps, tmp_path):
    def make_client(token: str = TOKEN, **kw) -> HubClient:
        kw.setdefault("node_id", "node-b")
        kw.setdefault("cache_dir", tmp_path / "cache")
        kw.setdefault("timeout_s", 10.0)  # generous: a loaded machine makes no spurious retry
        return HubClient(REPO, token=token, endpoint=emu.url, sleep=sleeps.append, **kw)

    return make_client


def spent(client: HubClient) -> tuple[int, int]:
    """(API calls, storage requests) the client counted."""
    return client.budget.calls(3600), client.budget.storage(3600)


def logged(emu: HubEmulator) -> tuple[int, int]:
    """(API requests, storage requests) the emulator's two origins saw."""
    return len(emu.requests), len(emu.storage.requests)


def counted_alike(emu: HubEmulator, client: HubClient) -> bool:
    """Every request the origins saw was counted by the client: none bypassed its hooks. (A
    slow answer is logged when the emulator gives it, after the client gave up on it.)"""
    emu.hurry()
    deadline = time.monotonic() + 30
    while logged(emu) != spent(client) and time.monotonic() < deadline:
        emu.stopping.wait(0.02)
    return logged(emu) == spent(client)


# -- the path and its cost ---------------------------------------------------------------------


def test_an_upload_and_a_download_take_the_lfs_path_and_every_request_is_counted(emu, make):
    client = make()
    head = client.commit({DELTA: DATA}, [], "node-b: delta 1")
    steps = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in emu.requests]
    assert steps == [("POST", "main"), ("POST", "batch"), ("POST", "verify"), ("POST", "main")]
    assert [m for m, _, _ in emu.storage.requests] == ["PUT"]
    assert emu.repo(REPO).head.lfs == {DELTA} and emu.repo(REPO).files[DELTA] == DATA
    assert spent(client) == logged(emu) == (4, 1) and client.budget.commits(60) == 1
    assert client.download(DELTA, head, 1 << 20) == DATA  # resolve: 302; the storage's GET
    assert spent(client) == logged(emu) == (5, 2)
    assert not [p for _, p, _ in emu.requests if "xet" in p]


CHILD = """
import importlib.util, json, sys
from huggingface_hub import constants
from speedtronic.hub.client import HubClient

url, token, cache = sys.argv[1:]
client = HubClient("alice/run", token=token, endpoint=url, cache_dir=cache)
data = bytes(range(256)) * 12
head = client.commit({"nodes/node-b/delta_00000001.safetensors": data}, [], "node-b: delta 1")
got = client.download("nodes/node-b/delta_00000001.safetensors", head, 1 << 20)
print(json.dumps({
    "xet_installed": importlib.util.find_spec("hf_xet") is not None,
    "xet_disabled": constants.HF_HUB_DISABLE_XET,
    "spent": [client.budget.calls(3600), client.budget.storage(3600)],
    "same": got == data,
}))
"""


@pytest.mark.parametrize("disable_xet", [None, "1"], ids=["default", "HF_HUB_DISABLE_XET"])
def test_the_default_environment_takes_the_lfs_path_with_every_request_hooked(
    emu, tmp_path, monkeypatch, disable_xet
):
    """A fresh process with the environment every user has: hf_xet installed (huggingface_hub
    depends on it here), HF_HUB_DISABLE_XET unset. Plain bytes would go to hf_xet's own HTTP
    client (tests/hub/test_emulator.py shows it); the client's uploads do not. With Xet
    disabled the path and its requests are the same."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_TELEMETRY="1")
    if disable_xet:
        env["HF_HUB_DISABLE_XET"] = disable_xet
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", CHILD, emu.url, TOKEN, str(tmp_path / "cache")]
    monkeypatch.setattr(time, "sleep", REAL_SLEEP)  # subprocess.run polls the child with it
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    expected = (True, bool(disable_xet), True)
    assert (found["xet_installed"], found["xet_disabled"], found["same"]) == expected
    assert not [p for _, p, _ in emu.requests if "xet" in p]
    assert emu.count("POST", r"\.git/info/lfs/objects/batch") == 1
    assert [m for m, _, _ in emu.storage.requests] == ["PUT", "GET"]
    assert tuple(found["spent"]) == logged(emu) == (5, 2)  # nothing bypassed the hooks
    assert done.stderr == ""  # not even the library's notice that buffers skip Xet


def test_what_each_operation_costs_is_what_the_budget_counts(emu, make):
    worker, master = make(node_id="node-b"), make(node_id="master")
    workers, masters = HubTransport(worker), HubTransport(master)

    def cost(client, fn, *args):
        before = spent(client)
        result = fn(*args)
        return result, tuple(a - b for a, b in zip(spent(client), before, strict=True))

    assert cost(master, masters.list_deltas)[1] == (2, 0)  # the first poll: head and a listing
    assert cost(master, masters.list_deltas)[1] == REQUESTS["idle_poll"]
    assert cost(worker, workers.upload, DELTA, DATA)[1] == REQUESTS["delta_upload"]
    refs, n = cost(master, masters.list_deltas)
    assert n == (2, 0) and [r.path for r in refs] == [DELTA]  # the head moved: a listing
    assert cost(master, masters.read, DELTA, 1 << 20) == (DATA, REQUESTS["delta_read"])
    step_count = {"outer_step": 1, "format": 1}
    _, n = cost(master, masters.publish, b"\0weights" * 100, step_count, [DELTA])
    assert n == REQUESTS["publish"] and emu.repo(REPO).head.lfs == {GLOBAL_WEIGHTS}
    assert cost(worker, workers.read_step_count) == (step_count, (2, 0))  # head + step count
    _, n = cost(worker, workers.read, GLOBAL_WEIGHTS, 1 << 20)
    assert (n[0] + 1, n[1]) == REQUESTS["global_read"]  # + the step count, read above
    # two clients: together they counted every request the origins saw
    assert tuple(map(sum, zip(spent(worker), spent(master), strict=True))) == logged(emu)


# -- faults, per step and origin ---------------------------------------------------------------

UPLOAD_STEPS = {  # step: (origin, method, path regex)
    "preupload": ("api", "POST", "/preupload/"),
    "batch": ("api", "POST", r"\.git/info/lfs/objects/batch"),
    "put": ("storage", "PUT", None),
    "verify": ("api", "POST", "/objects/verify"),
    "commit": ("api", "POST", "/commit/"),
}
DOWNLOAD_STEPS = {"resolve": ("api", "GET", "/resolve/"), "get": ("storage", "GET", None)}
FAULTS = [500, 503, 429, "timeout", "truncate", "slow"]


def arm(emu: HubEmulator, make, origin: str, method: str, path_re: str | None, kind):
    """Fault the first matching request; the client for it (a short timeout for "slow")."""
    plan, kw = (emu.faults if origin == "api" else emu.storage.faults), {}
    if kind == 429:
        kw["headers"] = {"Retry-After": "2"}
    if kind == "slow":
        kw["delay_s"] = 60.0  # the client gives up after its timeout; the test then hurries it
    plan.add(kind, method=method, path_re=path_re, **kw)
    return make(timeout_s=1.0) if kind == "slow" else make()


def retried(sleeps: list[float], kind) -> bool:
    """One retry; with a 1 s timeout a loaded machine may time out another request too."""
    return len(sleeps) >= 1 if kind == "slow" else len(sleeps) == 1


@pytest.mark.parametrize(
    ("step", "kind"),
    # a commit answered after the timeout: test_a_commit_answered_too_late_lands_once_...
    [
        (step, kind)
        for step in UPLOAD_STEPS
        for kind in FAULTS
        if (step, kind) != ("commit", "slow")
    ],
)
def test_each_fault_at_each_upload_step_is_retried_and_the_file_lands_once(
    emu, make, sleeps, step, kind
):
    before = len(emu.repo(REPO).commits)
    client = arm(emu, make, *UPLOAD_STEPS[step], kind)
    head = client.commit({DELTA: DATA}, [], "node-b: delta 1")
    repo = emu.repo(REPO)
    assert len(repo.commits) == before + 1 and head == repo.head.sha
    assert repo.files[DELTA] == DATA and repo.head.lfs == {DELTA}
    assert retried(sleeps, kind) and emu.faults.pending() == emu.storage.faults.pending() == 0
    if kind == 429:
        assert 2.0 <= sleeps[0] <= 3.0  # the reset the server named, plus jitter
    assert counted_alike(emu, client)
    assert client.budget.commits(60) == 1 and len(emu.repo(REPO).commits) == before + 1


@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("step", DOWNLOAD_STEPS)
def test_each_fault_at_each_download_step_is_retried(emu, make, sleeps, step, kind):
    revision = emu.push(REPO, {DELTA: DATA})
    client = arm(emu, make, *DOWNLOAD_STEPS[step], kind)
    assert client.download(DELTA, revision, 1 << 20) == DATA
    assert retried(sleeps, kind) and counted_alike(emu, client)


def test_a_commit_answered_too_late_lands_once_when_it_has_a_parent(emu, make, sleeps):
    """The commit is applied only after the client gave up on its answer. The repeat goes on
    the head the client then sees, so the late one finds the head moved (412) and changes
    nothing. (Without a parent, an upload's late twin would land as a second commit of the
    same bytes: same path, same blob, so the master still reads that delta once.)"""
    client = make(timeout_s=1.0)
    parent, before = emu.repo(REPO).head.sha, len(emu.repo(REPO).commits)
    emu.faults.add("slow", method="POST", path_re="/commit/", delay_s=60.0)
    head = client.commit({DELTA: DATA}, [], "master: publish", parent=parent)
    assert counted_alike(emu, client)  # the late request was answered (412) and logged
    assert [s for m, p, s in emu.requests if "/commit/" in p] == [200, 412]  # as answered
    assert len(emu.repo(REPO).commits) == before + 1 and head == emu.repo(REPO).head.sha


def test_a_put_whose_answer_was_lost_is_not_sent_again(emu, make, sleeps):
    client = make()
    emu.storage.faults.add(500, method="PUT", after_apply=True)  # stored; the answer lost
    client.commit({DELTA: DATA}, [], "node-b: delta 1")
    # the next attempt's batch answers "already stored": no second PUT
    assert [(m, s) for m, _, s in emu.storage.requests] == [("PUT", 500)]
    assert emu.repo(REPO).files[DELTA] == DATA and len(sleeps) == 1


def test_a_multipart_upload_survives_a_failed_part_and_completion(emu, make, sleeps):
    emu.state.lfs.multipart_threshold, emu.state.lfs.chunk_size = 1000, 1024
    client = make()
    emu.storage.faults.add(503, method="PUT", path_re="/part/2$")
    emu.faults.add(500, method="POST", path_re="/api/complete_multipart")
    client.commit({DELTA: DATA}, [], "node-b: delta 1")
    assert emu.repo(REPO).files[DELTA] == DATA and len(sleeps) == 2
    # Each retry starts the object over (a new upload id from a new batch answer): part 1,
    # part 2 (503); parts 1-3 and the completion (500); parts 1-3 and the completion
    parts = [(p.rsplit("/", 1)[-1], s) for m, p, s in emu.storage.requests]
    assert parts == [("1", 200), ("2", 503), *[(n, 200) for n in "123123"]]
    assert emu.count("POST", "/api/complete_multipart") == 2 and counted_alike(emu, client)


# -- what is permanent, and what is not ----------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("step", ["preupload", "batch", "verify", "commit"])
def test_the_hubs_401_and_403_at_any_upload_step_are_permanent(emu, make, sleeps, step, status):
    client = make()
    origin, method, path_re = UPLOAD_STEPS[step]
    emu.faults.add(status, method=method, path_re=path_re)
    with pytest.raises(HubError) as caught:
        client.commit({DELTA: DATA}, [], "node-b: delta 1")
    err = caught.value
    assert (err.status, err.permanent, sleeps) == (status, True, [])
    assert "\n" not in str(err) and err.hint and TOKEN not in str(err)
    assert emu.count(method, path_re) == 1  # not retried


def test_the_storages_403_is_retried_with_a_fresh_signed_url(emu, make, sleeps):
    client = make()
    emu.storage.faults.add(403, method="PUT")  # e.g. the signed URL expired on the way
    client.commit({DELTA: DATA}, [], "node-b: delta 1")
    assert emu.count("POST", "/objects/batch") == 2 and len(sleeps) == 1
    assert emu.repo(REPO).files[DELTA] == DATA


def test_a_read_only_token_stops_at_the_first_upload_step_in_one_line(emu, make, sleeps):
    client = make(token="hf_lfs_reader")
    with pytest.raises(HubError) as caught:
        client.commit({DELTA: DATA}, [], "node-b: delta 1")
    assert caught.value.permanent and sleeps == [] and logged(emu) == (1, 0)
    assert str(caught.value).startswith("node-b: token cannot write to alice/run (403): ")


# -- classification by the cause chain ----------------------------------------------------------


def test_the_librarys_runtime_error_around_a_failed_put_is_retried_by_its_cause(emu, make):
    client = make()
    seen: list[BaseException] = []
    classify = client.policy.classifier.classify

    def spy(exc, op, attempt=None):
        seen.append(exc)
        return classify(exc, op, attempt)

    client.policy.classifier.classify = spy
    emu.storage.faults.add(503, method="PUT")
    client.commit({DELTA: DATA}, [], "node-b: delta 1")
    (failed,) = seen  # what huggingface_hub raised, before the retry that worked
    assert type(failed) is RuntimeError and "Error while uploading" in str(failed)
    assert failed.__cause__.response.status_code == 503  # the storage's answer, in the chain
    assert isinstance(spy(failed, Op("cannot upload to", REPO, write=True)), Transient)


@pytest.mark.parametrize(
    "raised",
    [
        ConnectionError("Network error: Request error: xet-write-token 500"),  # hf_xet's
        RuntimeError("Error while uploading 'x' to the Hub."),  # an upload step, cause unknown
    ],
)
def test_failures_before_the_commit_request_are_transient(make, raised):
    client = make()
    op = Op("cannot upload to", REPO, write=True)
    err = client.policy.classifier.classify(raised, op)
    assert isinstance(err, Transient) and not err.ambiguous


def test_a_network_error_wrapped_twice_is_found_in_the_chain(make):
    client = make()
    request = httpx2.Request("PUT", "http://storage.invalid/x")
    try:
        try:
            try:
                raise httpx2.ReadTimeout("timed out", request=request)
            except httpx2.ReadTimeout as exc:
                raise NetworkFailure("ReadTimeout: timed out") from exc
        except NetworkFailure as exc:
            raise RuntimeError("Error while uploading 'x' to the Hub.") from exc
    except RuntimeError as exc:
        err = client.policy.classifier.classify(exc, Op("cannot upload to", REPO, write=True))
    assert isinstance(err, Transient) and "ReadTimeout" in err.detail


def test_an_exception_passed_through_is_not_made_its_own_cause(make, sleeps):
    client = make()
    own = HubError("already worded", status=400, permanent=True)

    def raising(exc):
        def fn():
            raise exc

        return fn

    with pytest.raises(HubError) as caught:
        client.policy.run(Op("cannot read", REPO), raising(own))
    assert caught.value is own and own.__cause__ is not own
    with pytest.raises(AttributeError) as bug:  # no Hub failure: raised as it came
        client.policy.run(Op("cannot read", REPO), raising(AttributeError("a bug")))
    assert bug.value.__cause__ is None and sleeps == []


# -- the master, at start --------------------------------------------------------------------------


def test_the_masters_start_survives_a_transient_storage_failure(emu, make, tmp_path):
    torch = pytest.importorskip("torch")
    from diloco_support import Log, settings

    from speedtronic.distributed.codec import decode_weights
    from speedtronic.distributed.master.loop import MasterLoop

    transport = HubTransport(make(node_id="master"), min_publish_interval_s=0)
    weights = {"weight": torch.ones(1, 2)}
    loop = MasterLoop(settings(), weights, transport, Log(), tmp_path / "state")
    emu.storage.faults.add(503, method="PUT", times=2)  # S3 answers 503 twice
    emu.faults.add(500, method="POST", path_re=r"\.git/info/lfs/objects/batch")
    loop.start()  # publishes outer step 0 through the faults
    head = emu.repo(REPO).head
    assert GLOBAL_WEIGHTS in head.lfs and json.loads(head.files[STEP_COUNT])["outer_step"] == 0
    step, published = decode_weights(head.files[GLOBAL_WEIGHTS], weights)
    assert step == 0 and torch.equal(published["weight"], weights["weight"])
    assert hashlib.sha256(head.files[GLOBAL_WEIGHTS]).hexdigest() in emu.repo(REPO).lfs_objects


def test_validate_gives_a_hub_runs_costs_per_operation_and_its_spend(tiny, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from speedtronic.cli.app import app

    tiny["distributed"] = {"enabled": True, "repo_id": REPO, "node_id": "a", "inner_steps": 50}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    done = CliRunner().invoke(app, ["validate", "-c", str(config), "--format", "json"])
    assert done.exit_code == 0, done.output
    facts = json.loads(done.stdout)["facts"]
    assert facts["diloco_hub_requests"]["delta_upload"] == {"api": 4, "storage": 1}
    assert {k: tuple(v.values()) for k, v in facts["diloco_hub_requests"].items()} == REQUESTS
    spend = facts["diloco_hub_budget_one_worker_at_1s_per_step"]
    # polls: 2 nodes x 5 in 5 min x 2; uploads: 6 in 5 min x (4 + the master's read 1);
    # publishes: 5 in 5 min (min_publish_interval_s 60) x (6 + the worker's global read 2)
    assert spend["api_calls_per_5min"] == 20 + 30 + 40 and spend["api_calls_limit_per_5min"] == 1000

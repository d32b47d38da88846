"""HubClient against the local Hub emulator, and the Budget arithmetic: every client operation,
its API-call cost, each fault (429 with reset, 5xx, dropped and slow answers, truncated bodies,
412, 401/403/404/400), ambiguous commits landing exactly once, and tokens kept out of every
message and log line. Backoff sleeps go to a list, so nothing here waits for real.
"""

# The environment must be set before huggingface_hub is imported, hence:
# ruff: noqa: E402
from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
import threading
from types import SimpleNamespace

os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_home_"))
os.environ.pop("HF_HUB_OFFLINE", None)

import pytest
from hub_emulator import HubEmulator, git_blob_id
from hub_emulator_lfs import pointer

from speedtronic.distributed.hub.cadence import (
    cadence_warnings,
    estimate_calls_per_5min,
    estimate_commits_per_hour,
    keyframes_every,
)
from speedtronic.errors import TransportError
from speedtronic.hub.budget import HUB_CALLS_PER_5_MIN, HUB_COMMITS_PER_HOUR, Budget
from speedtronic.hub.client import HubClient
from speedtronic.hub.errors import CommitConflict, HubError, RepoNotFound
from speedtronic.hub.files import git_blob_oid

pytestmark = [pytest.mark.hub, pytest.mark.usefixtures("library_sleeps")]

SECRET = "hf_SecretWriterToken0123456789"
READONLY = "hf_SecretReadOnlyToken987654321"
TOKENS = {SECRET: "alice", READONLY: "alice", "hf_bob": "bob"}
REPO = "alice/run"
SHA_A = "a" * 40


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def emu():
    with HubEmulator(TOKENS) as hub:
        hub.readonly(READONLY)
        hub.add_org("team", {"alice": "admin", "bob": "write"})
        yield hub


@pytest.fixture
def repo(emu):
    return emu.create_repo(REPO, private=True, files={"global/step_count.json": b'{"a": 1}'})


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make(emu, sleeps, tmp_path):
    def make_client(token: str | None = SECRET, **kw) -> HubClient:
        kw.setdefault("node_id", "node-b")
        kw.setdefault("cache_dir", tmp_path / "cache")
        kw.setdefault("max_attempts", 4)
        return HubClient(REPO, token=token, endpoint=emu.url, sleep=sleeps.append, **kw)

    return make_client


def calls(client: HubClient, fn, *args, **kw):
    """(result, API calls the operation made), counted on the client side per request."""
    before = client.budget.calls(3600)
    result = fn(*args, **kw)
    return result, client.budget.calls(3600) - before


def counted(client: HubClient, fn, *args, **kw):
    """(result, API calls, storage requests) the operation made, counted by the client."""
    before = client.budget.storage(3600)
    result, api = calls(client, fn, *args, **kw)
    return result, api, client.budget.storage(3600) - before


# -- Budget and cadence ----------------------------------------------------------------------------


def test_budget_windows_slide_and_prune():
    now = [1000.0]
    budget = Budget(clock=lambda: now[0])
    for _ in range(3):
        budget.count_call()
    budget.count_commit()
    now[0] += 301
    budget.count_call()
    budget.count_storage()
    assert (budget.calls(300), budget.calls(3600), budget.commits(3600)) == (1, 4, 1)
    assert budget.snapshot() == {
        "hub_calls_5min": 1,
        "hub_calls_1h": 4,
        "hub_storage_5min": 1,
        "hub_storage_1h": 1,
        "hub_commits_1h": 1,
    }
    now[0] += 3600
    assert set(budget.snapshot().values()) == {0}
    assert len(budget._calls) == len(budget._storage) == 0  # pruned, not only hidden


def test_budget_counts_exactly_across_threads():
    budget = Budget()
    threads = [
        threading.Thread(target=lambda: [budget.count_call() for _ in range(500)]) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.calls(60) == 4000


def test_default_like_cadence_raises_no_warning():
    kw = dict(nodes=4, inner_steps=500, step_time_s=1.0, poll_interval_s=60)
    assert cadence_warnings(**kw, min_publish_interval_s=60) == []
    assert estimate_commits_per_hour(
        nodes=4, inner_steps=500, step_time_s=1.0, min_publish_interval_s=60
    ) == pytest.approx(4 * 3600 / 500 + 3600 / 125)


def test_fast_inner_loops_warn_about_commits_and_the_fix_works():
    kw = dict(nodes=8, step_time_s=0.2, poll_interval_s=600, min_publish_interval_s=120)
    (line,) = cadence_warnings(inner_steps=100, **kw)
    assert "commits/hour" in line and "distributed.inner_steps" in line
    assert str(HUB_COMMITS_PER_HOUR) in line
    need = int(line.split("at least ")[1].split()[0])
    assert cadence_warnings(inner_steps=need, **kw) == []
    assert cadence_warnings(inner_steps=need - 1, **kw) != []


def test_keyframes_are_commits_of_their_own_and_the_warning_counts_them():
    # global_dtype int8 / int4 / deltas: a keyframe upload every keyframe_every publishes
    kw = dict(nodes=4, inner_steps=10, step_time_s=8.0, min_publish_interval_s=60)
    assert estimate_commits_per_hour(**kw) == pytest.approx(180 + 60)
    assert estimate_commits_per_hour(**kw, keyframe_every=10) == pytest.approx(180 + 66)
    # 8 workers at 0.2 s, publishes every 120 s: 30 x 1.5 an hour leave 57 for the deltas
    kw = dict(nodes=8, step_time_s=0.2, poll_interval_s=600, min_publish_interval_s=120)
    (line,) = cadence_warnings(inner_steps=100, keyframe_every=2, **kw)
    assert "cannot fit one Hub repo" in line and "s3://" in line
    need = int(line.split("at least ")[1].split()[0])
    assert need == math.ceil(8 * 3600 / ((102.4 - 45) * 0.2))
    assert cadence_warnings(inner_steps=need, keyframe_every=2, **kw) == []
    assert cadence_warnings(inner_steps=need - 1, keyframe_every=2, **kw) != []
    assert keyframes_every(SimpleNamespace(global_dtype="deltas", keyframe_every=10)) == 10
    assert keyframes_every(SimpleNamespace(global_dtype="fp32", keyframe_every=10)) == 0


def test_fast_polling_warns_about_calls_and_names_poll_interval():
    kw = dict(nodes=20, inner_steps=2000, step_time_s=1.0, min_publish_interval_s=300)
    (line,) = cadence_warnings(poll_interval_s=5, **kw)
    assert "distributed.poll_interval" in line and str(HUB_CALLS_PER_5_MIN) in line
    need = float(line.split("at least ")[1].split()[0])
    assert cadence_warnings(poll_interval_s=need, **kw) == []
    # Without a measured step time only the polling is estimated.
    assert estimate_calls_per_5min(
        nodes=1, inner_steps=1, step_time_s=None, poll_interval_s=60, min_publish_interval_s=0
    ) == pytest.approx(2 * 5 * 2)


def test_publishing_too_often_names_min_publish_interval():
    lines = cadence_warnings(
        nodes=1, inner_steps=1, step_time_s=0.01, poll_interval_s=600, min_publish_interval_s=1
    )
    assert any("distributed.min_publish_interval_s" in line for line in lines)


# -- operations and what each costs ----------------------------------------------------------------


def test_every_operation_against_the_emulator_and_its_call_count(emu, make):
    client = make()
    assert calls(client, client.visibility) == (None, 1)
    assert calls(client, client.create_repo, private=True) == (None, 1)
    assert calls(client, client.create_repo) == (None, 1)  # idempotent (409 is fine)
    assert calls(client, client.visibility) == (True, 1)
    assert calls(client, client.set_private, False) == (None, 1)
    assert emu.repo(REPO).private is False
    me, n = calls(client, client.whoami)
    assert n == 1 and (me["name"], me["orgs"], me["token_role"]) == ("alice", ["team"], "write")

    head, n = calls(client, client.head)
    assert (head, n) == (emu.repo(REPO).head.sha, 1)
    adds = {"nodes/a/delta_00000001.safetensors": b"x" * 64, "nodes/b/sub/c.txt": b"y"}
    new, n, put = counted(client, client.commit, adds, [], "upload", parent=head)
    # a preupload per file; the LFS one (*.safetensors): batch, PUT to storage, verify; commit
    assert (new, n, put) == (emu.repo(REPO).head.sha, 5, 1)
    assert emu.repo(REPO).files["nodes/b/sub/c.txt"] == b"y"
    assert emu.repo(REPO).head.lfs == {"nodes/a/delta_00000001.safetensors"}

    listed, n = calls(client, client.list_files, "nodes", new)
    assert n == 1 and [f.path for f in listed] == sorted(adds)
    lfs, regular = listed
    assert lfs.sha256 == hashlib.sha256(b"x" * 64).hexdigest() and lfs.size == 64
    assert lfs.oid == git_blob_id(pointer(lfs.sha256, 64))  # git holds the pointer
    assert regular.oid == git_blob_oid(b"y") == git_blob_id(b"y") and regular.sha256 is None
    assert calls(client, client.list_files, "nowhere", new) == ([], 1)
    timed, _ = calls(client, client.list_files, "nodes/a", new, with_times=True)
    assert timed[0].modified == pytest.approx(emu.repo(REPO).head.time)

    info, n = calls(client, client.paths_info, [*adds, "nodes/gone", "nodes"], new)
    assert n == 1 and sorted(info) == sorted(adds)  # missing paths and folders absent
    path = "nodes/a/delta_00000001.safetensors"
    # resolve answers 302 to the storage, which serves the bytes
    assert counted(client, client.download, path, new, 1 << 20) == (adds[path], 1, 1)
    assert counted(client, client.download, "nodes/b/sub/c.txt", new, 9) == (b"y", 1, 0)
    assert calls(client, client.download, "nodes/gone", new, 1 << 20) == (None, 1)

    gone, n = calls(client, client.commit, {}, [path], "consume")
    assert n == 1 and path not in emu.repo(REPO).files  # no adds: no preupload
    history, n = calls(client, client.commits)
    assert n == 1 and [c.sha for c in history] == [c.sha for c in emu.repo(REPO).commits][::-1]
    assert history[0].sha == gone and history[0].title == "consume"
    storage, n = calls(client, client.storage_bytes)
    assert n == 1 and storage == emu.repo(REPO).used_storage()
    assert calls(client, client.squash, "squash") == (None, 1)
    assert len(emu.repo(REPO).commits) == 1 and emu.repo(REPO).files == emu.repo(REPO).head.files
    assert calls(client, client.user_exists, "bob") == (True, 1)
    assert calls(client, client.user_exists, "nobody") == (False, 1)
    assert calls(client, client.org_members, "team") == ({"alice": "admin", "bob": "write"}, 1)
    assert calls(client, client.org_members, "no-such-org") == (None, 1)
    assert client.budget.commits(3600) == 3  # two commits and the squash
    assert len(emu.requests) == client.budget.calls(3600)  # every request counted, by origin
    assert len(emu.storage.requests) == client.budget.storage(3600) == 2


def test_listings_page_and_commit_history_stops_at_since(sleeps, tmp_path):
    now = [1_000_000.0]
    with HubEmulator(TOKENS, clock=lambda: now[0]) as emu:
        client = HubClient(
            REPO, token=SECRET, endpoint=emu.url, sleep=sleeps.append, cache_dir=tmp_path
        )
        emu.create_repo(REPO)
        emu.state.tree_page_size = 2
        head = emu.push(REPO, {f"nodes/n/delta_{i:08d}.safetensors": b"d" for i in range(5)})
        listed, n = calls(client, client.list_files, "nodes", head)
        assert (len(listed), n) == (5, 3)
        for i in range(60):
            now[0] += 10
            emu.push(REPO, {"global/step_count.json": str(i).encode()}, message=f"c{i}")
        recent, n = calls(client, client.commits, now[0] - 95)
        assert n == 1 and [c.title for c in recent] == [f"c{i}" for i in range(59, 49, -1)]
        assert len(client.commits()) == 62 and client.budget.calls(60) == 3 + 1 + 2


def test_downloads_of_globals_are_cached_per_revision_newest_only(emu, repo, make, tmp_path):
    client = make()
    rev1 = emu.repo(REPO).head.sha
    assert calls(client, client.download, "global/step_count.json", rev1, 100) == (b'{"a": 1}', 1)
    assert calls(client, client.download, "global/step_count.json", rev1, 100) == (b'{"a": 1}', 0)
    rev2 = emu.push(REPO, {"global/step_count.json": b'{"a": 2}', "nodes/x/d.bin": b"z"})
    assert client.download("global/step_count.json", rev2, 100) == b'{"a": 2}'
    assert client.download("nodes/x/d.bin", rev2, 100) == b"z"
    root = tmp_path / "cache" / "hub" / "alice--run" / "node-b"
    assert sorted(p.name for p in root.iterdir()) == [rev2]  # rev1 pruned, no deltas kept
    assert [p.name for p in root.rglob("*") if p.is_file()] == ["step_count.json"]
    # Branch names are not pins: never served from the cache.
    assert calls(client, client.download, "global/step_count.json", "main", 100)[1] == 1


def test_clients_share_a_budget_and_are_thread_safe(emu, repo, make):
    budget = Budget()
    clients = [make(budget=budget, node_id=f"n{i}") for i in range(4)]
    heads: list[str] = []
    threads = [
        threading.Thread(target=lambda c=c: heads.extend(c.head() for _ in range(5)))
        for c in clients
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(heads) == 20 and set(heads) == {emu.repo(REPO).head.sha}
    assert budget.calls(60) == 20


# -- transient faults ------------------------------------------------------------------------------


def test_429_waits_for_the_rate_limit_reset(emu, repo, make, sleeps):
    client = make()
    emu.faults.add(429, path_re=r"/api/models/alice/run$", headers={"Retry-After": "7"})
    assert client.head() == emu.repo(REPO).head.sha
    assert len(sleeps) == 1 and 7.0 <= sleeps[0] <= 8.0  # the reset, plus up to 1 s of jitter
    emu.faults.add(429, path_re=r"/api/models/alice/run$", headers={"Retry-After": "3600"})
    make(max_backoff_s=5.0).head()
    assert 5.0 <= sleeps[1] <= 6.0  # capped at max_backoff_s, then jittered: nodes spread out


def test_5xx_then_success_backs_off_with_full_jitter(emu, repo, make, sleeps):
    client = make()
    emu.faults.add(500, path_re="/tree/", times=1)
    emu.faults.add(503, path_re="/tree/", times=1)
    listed, n = calls(client, client.list_files, "global", emu.repo(REPO).head.sha)
    assert [f.path for f in listed] == ["global/step_count.json"] and n == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 1 and 0 <= sleeps[1] <= 2


def test_retries_run_out_as_a_transient_hub_error(emu, repo, make, sleeps):
    client = make(max_attempts=3)
    emu.faults.add(503, path_re="/paths-info/", times=10)
    with pytest.raises(HubError) as caught:
        client.paths_info(["global/step_count.json"], "main")
    err = caught.value
    assert (err.status, err.permanent, len(sleeps), len(emu.requests)) == (503, False, 2, 3)
    assert str(err).startswith("node-b: cannot read alice/run (503): ")
    assert str(err).endswith("(gave up after 3 attempts)") and "\n" not in str(err)


def test_dropped_and_slow_answers_are_retried(emu, repo, make):
    client = make(timeout_s=0.3)
    emu.faults.add("timeout", path_re=r"/api/models/alice/run$")
    emu.faults.add("slow", path_re=r"/api/models/alice/run$", delay_s=1.5)
    head, n = calls(client, client.head)
    assert head == emu.repo(REPO).head.sha and n == 3


def test_a_truncated_download_is_retried_never_returned(emu, repo, make, sleeps):
    client = make()
    data = bytes(range(256)) * 40
    rev = emu.push(REPO, {"nodes/a/delta_00000001.safetensors": data})
    emu.faults.add("truncate", method="GET", path_re="/resolve/", times=2)
    got, n = calls(client, client.download, "nodes/a/delta_00000001.safetensors", rev, 1 << 20)
    assert got == data and n == 3 and len(sleeps) == 2


def test_oversize_is_refused_before_the_body_and_not_retried(emu, repo, make, sleeps):
    client = make()
    rev = emu.push(REPO, {"global/latest.safetensors": b"w" * 5000})
    with pytest.raises(HubError) as caught:
        calls(client, client.download, "global/latest.safetensors", rev, 4999)
    assert "5000 bytes, over the 4999 byte cap" in str(caught.value)
    # not retried, and not the node's end: a bad file in the repo, the next one may be fine
    assert not caught.value.permanent and sleeps == [] and client.budget.calls(60) == 1
    assert client.download("global/latest.safetensors", rev, 5000) == b"w" * 5000


# -- commits: ambiguity and conflicts --------------------------------------------------------------


@pytest.mark.parametrize("fault", [500, 502, "timeout"])
@pytest.mark.parametrize("with_parent", [False, True])
def test_an_ambiguous_commit_lands_exactly_once(emu, repo, make, fault, with_parent):
    client = make()
    before = len(emu.repo(REPO).commits)
    parent = emu.repo(REPO).head.sha if with_parent else None
    emu.faults.add(fault, method="POST", path_re="/commit/", after_apply=True)
    adds = {"nodes/b/delta_00000002.safetensors": b"delta", "global/step_count.json": b"{}"}
    head = client.commit(adds, [], "publish", parent=parent)
    assert len(emu.repo(REPO).commits) == before + 1
    assert (
        head == emu.repo(REPO).head.sha and emu.repo(REPO).files["global/step_count.json"] == b"{}"
    )
    assert client.budget.commits(60) == 1


def test_a_lost_commit_that_did_not_land_is_sent_again(emu, repo, make):
    client = make()
    before = len(emu.repo(REPO).commits)
    emu.faults.add(500, method="POST", path_re="/commit/")  # answered before applying
    path = "nodes/b/delta_00000003.safetensors"
    head, n, put = counted(client, client.commit, {path: b"d"}, [], "upload")
    # the upload (preupload, batch, PUT, verify), the commit (500), then the look: one page of
    # main's commits (its id is not there), then the commit again, with the head just seen as
    # parent; the file is not uploaded twice
    assert len(emu.repo(REPO).commits) == before + 1 and head == emu.repo(REPO).head.sha
    assert (n, put) == (6, 1)


def test_a_lost_commit_whose_files_changed_since_is_not_sent_again(emu, repo, tmp_path):
    """A worker's delta lands, its answer is lost, and the master consumes (deletes) it before
    the worker looks: the commit is recognised by its id, not by the files at head."""
    path = "nodes/b/delta_00000004.safetensors"

    def consume_before_the_look(*args, **kwargs):
        emu.push(REPO, {}, [path], message="master: publish")  # the master was quicker
        return 0.0

    client = HubClient(
        REPO, token=SECRET, endpoint=emu.url, cache_dir=tmp_path, sleep=consume_before_the_look
    )
    before = len(emu.repo(REPO).commits)
    emu.faults.add(500, method="POST", path_re="/commit/", after_apply=True)
    head = client.commit({path: b"d"}, [], "b: delta 4")
    titles = [c.title for c in emu.repo(REPO).commits[before:]]
    assert titles == ["b: delta 4", "master: publish"], titles  # not sent a second time
    assert head == emu.repo(REPO).commits[before].sha and client.budget.commits(60) == 1


def test_a_lost_delete_commit_is_recognised_once_landed(emu, repo, make):
    client = make()
    rev = emu.push(REPO, {"nodes/b/delta_00000001.safetensors": b"old"})
    before = len(emu.repo(REPO).commits)
    emu.faults.add(503, method="POST", path_re="/commit/", after_apply=True)
    client.commit({"global/x": b"1"}, ["nodes/b/delta_00000001.safetensors"], "m", parent=rev)
    assert len(emu.repo(REPO).commits) == before + 1


@pytest.mark.parametrize("chain_parents", [False, True])
def test_commits_under_random_transient_faults_each_land_exactly_once(
    emu, repo, make, library_sleeps, chain_parents
):
    """The end-to-end condition in small: 20% of requests fail (half the failed commits after
    landing); every commit lands once and in order. Preupload retries inside huggingface_hub."""
    client = make(max_attempts=12)
    base = len(emu.repo(REPO).commits)
    emu.faults.random(0.2, seed=7, ambiguous=True)
    head = emu.repo(REPO).head.sha
    for i in range(25):
        adds = {f"nodes/b/delta_{i:08d}.safetensors": i.to_bytes(4, "big")}
        head = client.commit(adds, [], f"delta {i}", parent=head if chain_parents else None)
    emu.faults.clear()
    repo_now = emu.repo(REPO)
    assert len(repo_now.commits) == base + 25 and head == repo_now.head.sha
    assert [c.title for c in repo_now.commits[base:]] == [f"delta {i}" for i in range(25)]
    assert client.budget.commits(3600) == 25
    # no library_sleeps.clear(): the library never retries (and sleeps) under the client


def test_412_is_a_commit_conflict_and_not_retried(emu, repo, make, sleeps):
    client = make()
    stale = emu.repo(REPO).head.sha
    emu.push(REPO, {"nodes/other/delta_00000001.safetensors": b"o"})
    with pytest.raises(CommitConflict) as caught:
        client.commit({"global/step_count.json": b"{}"}, [], "publish", parent=stale)
    assert caught.value.status == 412 and sleeps == [] and client.budget.calls(60) == 2
    assert str(caught.value).startswith("node-b: commit conflict on alice/run (412): ")


def test_a_request_on_a_shared_session_closed_under_it_is_retried(emu, repo, make, sleeps):
    """huggingface_hub closes its shared session after a connection error in any thread's
    request (http_backoff): a request of another thread that picked it up just before fails
    with RuntimeError. It was never sent, so it is retried, not raised as a bug."""
    from huggingface_hub import utils as hf_utils

    client = make()
    head = client.head()
    closed = hf_utils.get_session()
    hf_utils.close_session()  # what http_backoff does after a ConnectError
    real, handed = hf_utils.get_session, []

    def stale_first(*args, **kwargs):  # the first attempt's two look-ups get the closed one
        handed.append(1)
        return closed if len(handed) <= 2 else real()

    hf_utils.get_session = stale_first
    try:
        files = client.list_files("global", head)
    finally:
        hf_utils.get_session = real
    assert [f.path for f in files] == ["global/step_count.json"] and 1 <= len(sleeps) <= 2


# -- permanent failures ----------------------------------------------------------------------------


def test_a_token_that_cannot_write_fails_at_once_in_one_line(emu, repo, make, sleeps):
    client = make(token=READONLY)
    with pytest.raises(HubError) as caught:
        client.commit({"nodes/b/delta_00000001.safetensors": b"d"}, [], "upload")
    err = caught.value
    assert (err.status, err.permanent, sleeps, len(emu.requests)) == (403, True, [], 1)
    assert str(err).startswith("node-b: token cannot write to alice/run (403): Forbidden")
    assert "\n" not in str(err) and isinstance(err, TransportError) and err.exit_code == 1
    assert err.hint


def test_an_invalid_token_fails_at_once_with_a_login_hint(emu, repo, make, sleeps):
    client = make(token="hf_NotAValidToken000000000000")
    with pytest.raises(HubError) as caught:
        client.head()
    err = caught.value
    assert (err.status, err.permanent, sleeps, len(emu.requests)) == (401, True, [], 1)
    assert str(err) == (
        "node-b: token rejected by the Hub for alice/run (401): "
        "Invalid credentials in Authorization header"
    )
    assert "HF_TOKEN" in err.hint


def test_a_missing_repo_says_how_to_create_it(emu, make, sleeps):
    client = make()
    for op in (
        client.head,
        lambda: client.commit({"a": b"1"}, [], "m"),
        lambda: client.list_files("nodes", "main"),
        lambda: client.download("global/latest.safetensors", "main", 10),
    ):
        with pytest.raises(RepoNotFound) as caught:
            op()
        assert caught.value.hint == "create it with: speedtronic hub init alice/run"
        assert str(caught.value).startswith("node-b: cannot find repo alice/run (404)")
    assert sleeps == [] and client.budget.calls(60) == 4


def test_400_is_permanent(emu, repo, make, sleeps):
    client = make()
    emu.faults.add(400, path_re="/paths-info/")
    with pytest.raises(HubError) as caught:
        client.paths_info(["x"], "main")
    assert (caught.value.status, caught.value.permanent, sleeps) == (400, True, [])


def test_no_token_anywhere_is_a_clear_error(emu, make):
    with pytest.raises(HubError) as caught:
        make(token=None).whoami()
    assert "no token found" in str(caught.value) and "HF_TOKEN" in caught.value.hint


def test_the_token_is_never_in_a_message_repr_or_log_line(emu, repo, make, caplog):
    caplog.set_level(logging.DEBUG)
    messages = []
    writer, reader = make(), make(token=READONLY)
    emu.faults.add(503, times=20)
    with pytest.raises(HubError) as caught:
        writer.head()
    messages.append(str(caught.value))
    emu.faults.clear()
    for client, op in (
        (reader, lambda c: c.commit({"a": b"1"}, [], "m")),
        (make(token=SECRET + "x"), lambda c: c.head()),
        (writer, lambda c: c.commit({"a": b"1"}, [], "m", parent=SHA_A)),
        (writer, lambda c: c.download("global/step_count.json", "main", 1)),
    ):
        with pytest.raises(HubError) as caught:
            op(client)
        messages += [str(caught.value), caught.value.hint or "", repr(client)]
    logged = [r.getMessage() for r in caplog.records]
    assert logged and any("retrying" in line for line in logged)
    for text in messages + logged:
        assert SECRET not in text and READONLY not in text


def test_a_commit_lost_on_its_last_attempt_is_looked_for_before_giving_up(emu, repo, make):
    client = make(max_attempts=1)
    before = len(emu.repo(REPO).commits)
    emu.faults.add(500, method="POST", path_re="/commit/", after_apply=True)
    head = client.commit({"nodes/b/delta_00000001.safetensors": b"d"}, [], "b: delta 1")
    assert head == emu.repo(REPO).head.sha and len(emu.repo(REPO).commits) == before + 1


def test_a_garbled_answer_is_retried_and_never_escapes_raw(make, sleeps):
    client = make(max_attempts=2)

    def garbled():  # e.g. a proxy's HTML page where JSON was expected
        raise ValueError("Expecting value: line 1 column 1 (char 0)")

    with pytest.raises(HubError, match="unreadable answer") as caught:
        client._run(client._op("cannot read"), garbled)
    assert len(sleeps) == 1 and not caught.value.permanent  # retried, then a HubError


def test_a_session_the_library_makes_anew_still_carries_the_timeout_hooks(emu, repo, make):
    from huggingface_hub import utils as hf_utils

    make().head()
    hf_utils.close_session()  # what the library does after a connection error in any thread
    hooks = hf_utils.get_session().event_hooks
    assert [h.__name__ for h in hooks["response"]] == ["_on_response"]
    assert "_on_request" in [h.__name__ for h in hooks["request"]]

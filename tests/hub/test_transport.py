"""HubTransport over the in-memory FakeHubClient: each operation, call counts, pinning, races.

The fake behaves as HubClient promises (tests/hub_fake.py), so these tests pin down what the
transport adds: how many API calls a poll costs, which revision a read comes from, the one
commit a publish makes and what happens when the head moved under it. Also the new
``distributed`` config keys and ``open_transport``'s dispatch. Pure in-memory, well under 5 s.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

import proc_support
import pytest
from hub_fake import FakeHub, FakeHubClient, hub_error

from speedtronic.config import SpeedtronicConfig
from speedtronic.distributed.hub.publish import PUBLISH_BUDGET_S
from speedtronic.distributed.hub.transport import MAX_PUBLISH_ATTEMPTS, HubTransport
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, delta_path
from speedtronic.distributed.repos import open_transport
from speedtronic.distributed.transport import LocalTransport
from speedtronic.errors import ConfigError, TransportError
from speedtronic.hub.budget import Budget
from speedtronic.hub.errors import CommitConflict, HubError
from speedtronic.hub.files import git_blob_oid

REPO = "my-org/run"


@pytest.fixture
def hub():
    hub = FakeHub()
    hub.create(REPO)
    return hub


def node(hub, name, **kwargs):
    """A transport for node ``name`` and its client (to count its calls)."""
    client = FakeHubClient(REPO, node_id=name, hub=hub)
    return HubTransport(client, **kwargs), client


def step_json(n: int) -> dict:
    return {"outer_step": n, "format": 1}


def published(hub, n: int, weights: bytes | None = None) -> str:
    """Another master's publish of outer step ``n``, straight to the server."""
    body = json.dumps(step_json(n)).encode()
    return hub.push(REPO, {GLOBAL_WEIGHTS: weights or b"w%d" % n, STEP_COUNT: body}, [], "other")


def files(hub) -> dict[str, bytes]:
    return hub.repos[REPO].files


# ---------------------------------------------------------------------- upload


def test_upload_is_one_commit_named_after_the_node_and_delta(hub):
    transport, client = node(hub, "node-a")
    transport.upload(delta_path("node-a", 3), b"delta bytes")
    assert files(hub)[delta_path("node-a", 3)] == b"delta bytes"
    assert hub.repos[REPO].head.title == "node-a: delta 3"
    assert client.calls == ["commit"]
    assert transport.stats()["hub_uploads"] == 1
    assert transport.stats()["hub_commits_1h"] == 1


@pytest.mark.parametrize("path", ["../x", "/abs", "nodes//a", "nodes/./a", ""])
def test_upload_refuses_paths_outside_the_repo(hub, path):
    transport, client = node(hub, "a")
    with pytest.raises(TransportError, match="refusing repo path"):
        transport.upload(path, b"x")
    assert client.calls == []


def test_a_failed_upload_raises_and_lands_nothing(hub):
    transport, client = node(hub, "a")
    client.fail("commit", hub_error(HubError, "a: token cannot write (403)", 403, True))
    with pytest.raises(TransportError, match="403"):
        transport.upload(delta_path("a", 1), b"x")
    assert delta_path("a", 1) not in files(hub)
    assert transport.stats()["hub_uploads"] == 0


@pytest.mark.parametrize("landed", [True, False])
def test_an_ambiguous_upload_lands_exactly_once(hub, landed):
    transport, client = node(hub, "a")
    before = len(hub.repos[REPO].history)
    client.ambiguous(landed)
    transport.upload(delta_path("a", 1), b"x")
    assert files(hub)[delta_path("a", 1)] == b"x"
    assert len(hub.repos[REPO].history) == before + 1


# ---------------------------------------------------------------------- listing


def test_list_deltas_names_every_entry_under_nodes_and_why_strangers_are_no_deltas(hub):
    good = [delta_path("a", 1), "nodes/a/delta_2.safetensors", delta_path("b", 12)]
    strangers = ["nodes/a/notes.txt", "nodes/a/x/delta_00000001"]
    hub.push(REPO, {p: p.encode() for p in good + strangers + ["global/x"]}, [], "setup")
    transport, _ = node(hub, "master")
    refs = transport.list_deltas()
    deltas = [r for r in refs if r.problem is None]
    assert [r.path for r in deltas] == sorted(good)
    assert [r.version for r in deltas] == [git_blob_oid(p.encode()) for p in sorted(good)]
    assert [r.size for r in deltas] == [len(p) for p in sorted(good)]
    problems = {r.path: r.problem for r in refs if r.problem is not None}
    assert problems == {
        "nodes/a/notes.txt": "not named delta_<digits>.safetensors",
        "nodes/a/x/delta_00000001": "nested below a node's folder",
    }


def test_an_idle_master_poll_costs_one_call_and_a_changed_one_two(hub):
    master, calls = node(hub, "master")
    worker, _ = node(hub, "a")
    assert master.list_deltas() == []
    assert calls.calls == ["head", "list_files"]
    for _ in range(5):
        master.list_deltas()
    assert calls.calls[2:] == ["head"] * 5  # idle: head only
    worker.upload(delta_path("a", 1), b"x")
    calls.calls.clear()
    assert [r.path for r in master.list_deltas()] == [delta_path("a", 1)]
    assert calls.calls == ["head", "list_files"]  # at most 2 calls per poll


def test_reads_of_listed_deltas_are_pinned_to_the_listed_revision(hub):
    master, _ = node(hub, "master")
    worker, _ = node(hub, "a")
    path = delta_path("a", 1)
    worker.upload(path, b"first bytes")
    (ref,) = master.list_deltas()
    worker.upload(path, b"second bytes")  # a restarted worker reusing the name
    assert master.read(path, 100) == b"first bytes"  # the bytes whose version was listed
    assert ref.version == git_blob_oid(b"first bytes")
    assert master.read(delta_path("a", 9), 100) is None  # never listed, absent at head


def test_read_caps_the_size(hub):
    worker, _ = node(hub, "a")
    worker.upload(delta_path("a", 1), b"x" * 100)
    master, _ = node(hub, "master")
    master.list_deltas()
    with pytest.raises(TransportError, match="over the 10"):
        master.read(delta_path("a", 1), 10)


# ---------------------------------------------------------------------- step count


def test_read_step_count_is_none_then_cached_while_the_head_stays(hub):
    worker, calls = node(hub, "a")
    assert worker.read_step_count() is None
    published(hub, 4)
    calls.calls.clear()
    assert worker.read_step_count() == step_json(4)
    assert calls.calls == ["head", "download"]
    value = worker.read_step_count()
    value["outer_step"] = 99  # a caller's change must not reach the cache
    assert worker.read_step_count() == step_json(4)
    assert calls.calls[2:] == ["head", "head"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"outer_step": "3"}', "outer_step '3': must be an integer"),
    ],
)
def test_a_bad_step_count_is_one_line_naming_the_repo_and_read_once(hub, body, error):
    hub.push(REPO, {STEP_COUNT: body}, [], "garbage")
    worker, calls = node(hub, "a")
    for _ in range(2):
        with pytest.raises(TransportError, match=error) as info:
            worker.read_step_count()
        assert str(info.value).startswith(f"{REPO}: {STEP_COUNT}") and "\n" not in str(info.value)
    assert calls.count("download") == 1


def test_an_oversize_step_count_is_refused(hub):
    hub.push(REPO, {STEP_COUNT: b" " * (64 << 10) + b"{}"}, [], "huge")
    worker, _ = node(hub, "a")
    with pytest.raises(TransportError, match="over the 65536"):
        worker.read_step_count()


def test_weights_come_from_the_commit_whose_step_count_was_read(hub):
    published(hub, 1, b"weights one")
    worker, _ = node(hub, "a")
    assert worker.read_step_count()["outer_step"] == 1
    published(hub, 2, b"weights two")  # a publish between the two reads
    assert worker.read(GLOBAL_WEIGHTS, 100) == b"weights one"
    assert worker.read_step_count()["outer_step"] == 2
    assert worker.read(GLOBAL_WEIGHTS, 100) == b"weights two"


# ---------------------------------------------------------------------- publish


def test_publish_is_one_commit_and_skips_consumed_deltas_already_gone(hub):
    worker, _ = node(hub, "a")
    for seq in (1, 2):
        worker.upload(delta_path("a", seq), b"d%d" % seq)
    master, calls = node(hub, "master", squash_every=0)
    assert master.read_step_count() is None
    master.list_deltas()
    hub.push(REPO, {}, [delta_path("a", 2)], "someone removed it")
    master.list_deltas()
    commits = len(hub.repos[REPO].history)
    calls.calls.clear()
    master.publish(b"weights", step_json(1), [delta_path("a", 1), delta_path("a", 2)])
    assert len(hub.repos[REPO].history) == commits + 1
    assert calls.calls == ["paths_info", "commit"]
    state = files(hub)
    assert state[GLOBAL_WEIGHTS] == b"weights"
    assert json.loads(state[STEP_COUNT]) == step_json(1)
    assert not any(p.startswith("nodes/") for p in state)
    assert hub.repos[REPO].head.title == "master: publish outer step 1"
    assert master.stats()["hub_publishes"] == 1


def test_after_its_own_publish_the_master_polls_from_its_caches(hub):
    worker, _ = node(hub, "a")
    worker.upload(delta_path("a", 1), b"d")
    master, calls = node(hub, "master")
    master.list_deltas()
    master.publish(b"w", step_json(1), [delta_path("a", 1)])
    calls.calls.clear()
    assert master.list_deltas() == []
    assert master.read_step_count() == step_json(1)
    assert calls.calls == ["head", "head"]
    assert master.read(GLOBAL_WEIGHTS, 10) == b"w"


def test_a_worker_upload_during_a_publish_is_kept_and_the_publish_retried(hub):
    worker, _ = node(hub, "a")
    worker.upload(delta_path("a", 1), b"d1")
    master, client = node(hub, "master")
    master.list_deltas()
    client.before("commit", lambda: worker.upload(delta_path("a", 2), b"d2"))
    master.publish(b"w", step_json(1), [delta_path("a", 1)])
    state = files(hub)
    assert delta_path("a", 2) in state and delta_path("a", 1) not in state
    assert json.loads(state[STEP_COUNT])["outer_step"] == 1
    assert master.stats()["hub_publish_conflicts"] == 1
    assert client.count("download") == 0  # the step count there was still ours: no download


def test_another_master_publishing_during_ours_stops_this_one(hub):
    master, client = node(hub, "master")
    master.read_step_count()
    client.before("commit", lambda: published(hub, 3))
    with pytest.raises(TransportError) as info:
        master.publish(b"mine", step_json(3), [])
    assert str(info.value) == (
        f"another master published outer step 3 to {REPO}; only one master may run"
    )
    assert files(hub)[GLOBAL_WEIGHTS] == b"w3"  # theirs is untouched


def test_another_master_seen_before_publishing_is_caught_too(hub):
    master, _ = node(hub, "master")
    master.read_step_count()
    published(hub, 5)
    master.list_deltas()  # the head moved: the parent already has their step count
    with pytest.raises(TransportError, match="another master published outer step 5"):
        master.publish(b"mine", step_json(4), [])


def test_a_conflict_with_an_older_step_count_is_retried(hub):
    published(hub, 1)
    master, client = node(hub, "master")
    client.before("commit", lambda: published(hub, 2))
    master.publish(b"mine", step_json(7), [])
    assert json.loads(files(hub)[STEP_COUNT])["outer_step"] == 7


def test_commits_under_nodes_never_starve_a_publish(hub):
    """Issue 26: a fleet's deltas moved the head under 5 publish attempts in a row and the
    master gave up ('the repo changed under 5 commits in a row'), though nothing it wrote
    could conflict with them."""
    master, client = node(hub, "master")
    master.read_step_count()
    busy = 4 * MAX_PUBLISH_ATTEMPTS
    for i in range(busy):
        client.before("commit", lambda i=i: hub.push(REPO, {f"nodes/x/delta_{i}": b"y"}, [], "x"))
    master.publish(b"w", step_json(1), [])
    assert client.count("commit") == busy + 1 and json.loads(files(hub)[STEP_COUNT])["outer_step"]
    assert master.stats()["hub_publish_conflicts"] == busy and files(hub)[GLOBAL_WEIGHTS] == b"w"


def test_a_publish_refused_for_its_whole_time_budget_gives_up(hub):
    now = [0.0]
    client = FakeHubClient(REPO, node_id="master", hub=hub, budget=Budget(lambda: now[0]))
    master = HubTransport(client)
    master.read_step_count()

    def busy():
        now[0] += PUBLISH_BUDGET_S / 3 + 1
        hub.push(REPO, {f"nodes/x/delta_{now[0]}": b"y"}, [], "x")

    for _ in range(10):
        client.before("commit", busy)
    with pytest.raises(TransportError, match="kept moving under it for 300 s"):
        master.publish(b"w", step_json(1), [])
    assert client.count("commit") == 3 and GLOBAL_WEIGHTS not in files(hub)


def test_a_step_count_rewritten_under_every_attempt_ends_the_publish(hub):
    """Only global/ changing under it (here a stranger rewriting an older step count each
    time) counts toward giving up."""
    master, client = node(hub, "master")
    master.read_step_count()
    for i in range(2 * MAX_PUBLISH_ATTEMPTS):
        body = json.dumps({"outer_step": 0, "format": 1, "note": i}).encode()
        client.before("commit", lambda body=body: hub.push(REPO, {STEP_COUNT: body}, [], "x"))
    with pytest.raises(TransportError, match="could not publish outer step 1"):
        master.publish(b"w", step_json(1), [])
    assert client.count("commit") == MAX_PUBLISH_ATTEMPTS + 1
    assert GLOBAL_WEIGHTS not in files(hub)


def test_a_failed_publish_raises_and_lands_nothing(hub):
    master, client = node(hub, "master")
    client.fail("commit", hub_error(HubError, "master: 500 after 8 attempts", 500, False))
    with pytest.raises(TransportError, match="500"):
        master.publish(b"w", step_json(1), [])
    assert STEP_COUNT not in files(hub)
    master.publish(b"w", step_json(1), [])  # and the next one goes through
    assert json.loads(files(hub)[STEP_COUNT]) == step_json(1)


def publish_titles(hub) -> list[str]:
    return [c.title for c in hub.repos[REPO].history if ": publish outer step" in c.title]


def test_a_publish_sent_again_after_it_landed_unseen_is_not_committed_twice(hub):
    """The Hub e2e run's CI failure: a publish whose commit landed but whose answer was lost
    (and not found yet) is sent again, with a fresh time stamp; before, that was a second
    'publish outer step 2' commit. The step count at the head is recognised as this publish."""
    worker, _ = node(hub, "a")
    master, client = node(hub, "master")
    master.publish(b"w1", step_json(1), [])
    worker.upload(delta_path("a", 1), b"d")
    master.list_deltas()
    client.lost()
    with pytest.raises(HubError):
        master.publish(b"w2", {**step_json(2), "updated_at": "10:00:00"}, [delta_path("a", 1)])
    worker.upload(delta_path("a", 2), b"d2")  # the head moves on under nodes/
    master.publish(b"w2", {**step_json(2), "updated_at": "10:00:07"}, [delta_path("a", 1)])
    assert publish_titles(hub) == ["master: publish outer step 1", "master: publish outer step 2"]
    assert client.count("commit") == 3 and master.stats()["hub_publishes"] == 2
    assert master.read_step_count()["updated_at"] == "10:00:00"  # the one that landed
    assert delta_path("a", 2) in files(hub) and delta_path("a", 1) not in files(hub)
    master.publish(b"w3", step_json(3), [])  # and the next publish builds on it
    assert json.loads(files(hub)[STEP_COUNT]) == step_json(3)


@pytest.mark.parametrize("change", ["weights", "content"])
def test_a_publish_landed_unseen_is_sent_again_when_the_repo_differs_from_it(hub, change):
    """Only the very publish is recognised: weights replaced since (a damaged global), or a
    step count with other content (a republish with a new node summary), is committed."""
    master, client = node(hub, "master")
    client.lost()
    with pytest.raises(HubError):
        master.publish(b"w1", step_json(1), [])
    if change == "weights":
        hub.push(REPO, {GLOBAL_WEIGHTS: b"broken"}, [], "someone")
        again = step_json(1)
    else:
        again = {**step_json(1), "nodes": {"a": {"seq": 1}}}
    master.publish(b"w1", again, [])
    assert len(publish_titles(hub)) == 2
    assert files(hub)[GLOBAL_WEIGHTS] == b"w1" and json.loads(files(hub)[STEP_COUNT]) == again


# ---------------------------------------------------------------------- squash


def test_squash_every_n_publishes(hub):
    master, client = node(hub, "master", squash_every=2)
    for step in range(1, 6):
        master.publish(b"w%d" % step, step_json(step), [])
    assert client.count("squash") == 2  # after publishes 2 and 4
    history = hub.repos[REPO].history
    assert len(history) == 2  # the squash after 4, then publish 5
    assert history[0].title == "master: squash history at outer step 4"
    assert master.stats()["hub_squashes"] == 2
    assert master.read_step_count() == step_json(5)


def test_no_squash_when_off(hub):
    master, client = node(hub, "master")
    for step in range(1, 4):
        master.publish(b"w", step_json(step), [])
    assert client.count("squash") == 0


def test_a_failed_squash_keeps_the_publish_and_is_reported(hub):
    master, client = node(hub, "master", squash_every=1)
    client.fail("squash", hub_error(HubError, "master: squash refused (403)", 403, True))
    master.publish(b"w", step_json(1), [])
    assert json.loads(files(hub)[STEP_COUNT]) == step_json(1)
    assert master.stats()["hub_squash_failures"] == 1
    (warning,) = master.take_warnings()
    assert warning.startswith(f"{REPO}: history squash failed") and "403" in warning
    assert master.take_warnings() == []
    master.publish(b"w", step_json(2), [])  # the next one squashes
    assert master.stats()["hub_squashes"] == 1


def test_reads_work_after_a_squash_removed_the_pinned_revisions(hub):
    worker, _ = node(hub, "a")
    worker.upload(delta_path("a", 1), b"d")
    master, _ = node(hub, "master", squash_every=1)
    master.list_deltas()
    master.read_step_count()
    master.publish(b"w", step_json(1), [])
    assert [r.path for r in master.list_deltas()] == [delta_path("a", 1)]
    assert master.read(delta_path("a", 1), 10) == b"d"
    assert master.read_step_count() == step_json(1)
    assert master.read(GLOBAL_WEIGHTS, 10) == b"w"


# ---------------------------------------------------------------------- the rest


def test_describe_stats_and_settings(hub):
    transport, _ = node(hub, "a", min_publish_interval_s=120.0, squash_every=3)
    assert transport.describe() == f"hf://{REPO}"
    assert transport.min_publish_interval_s == 120.0 and transport.squash_every == 3
    stats = transport.stats()
    assert {"hub_calls_5min", "hub_calls_1h", "hub_commits_1h", "hub_uploads"} <= set(stats)
    assert all(isinstance(v, int) for v in stats.values())


def test_missing_repo_is_the_clients_error(hub):
    transport = HubTransport(FakeHubClient("my-org/absent", hub=hub))
    with pytest.raises(TransportError, match="not found"):
        transport.list_deltas()


def test_uploader_and_poller_threads_share_one_transport(hub):
    worker, _ = node(hub, "a")
    errors = []

    def upload():
        for seq in range(1, 41):
            worker.upload(delta_path("a", seq), b"%d" % seq)

    def poll():
        try:
            for _ in range(200):
                for ref in worker.list_deltas():
                    assert worker.read(ref.path, 10) is not None
                worker.read_step_count()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=upload), threading.Thread(target=poll)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(worker.list_deltas()) == 40


def test_commit_conflict_is_a_transport_error():
    assert issubclass(CommitConflict, TransportError)


# ---------------------------------------------------------------------- config


def test_new_distributed_keys_have_defaults_and_load():
    default = SpeedtronicConfig.from_dict({}).distributed
    assert (default.min_publish_interval_s, default.squash_every) == (60.0, 0)
    assert (default.collaborators, default.cache_dir) == ([], None)
    raw = {
        "min_publish_interval_s": 0,
        "squash_every": 50,
        "collaborators": ["bob", "carol-1", "d.e_f"],
        "cache_dir": "/tmp/cache",
    }
    loaded = SpeedtronicConfig.from_dict({"distributed": raw}).distributed
    assert loaded.min_publish_interval_s == 0.0 and loaded.squash_every == 50
    assert loaded.collaborators == ["bob", "carol-1", "d.e_f"]
    assert loaded.cache_dir == "/tmp/cache"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"min_publish_interval_s": -1},
            "distributed.min_publish_interval_s: must be in [0, 86400]",
        ),
        ({"min_publish_interval_s": 1e6}, "distributed.min_publish_interval_s: must be in"),
        ({"squash_every": -1}, "distributed.squash_every: must be in [0, 2**40]"),
        ({"squash_every": 1.5}, "distributed.squash_every: must be"),
        ({"collaborators": "bob"}, "distributed.collaborators: must be"),
        ({"collaborators": ["bob", "bad name"]}, "distributed.collaborators: 'bad name' is not"),
        ({"collaborators": ["-bob"]}, "distributed.collaborators: '-bob' is not"),
        ({"collaborators": ["a--b"]}, "distributed.collaborators: 'a--b' is not"),
        ({"collaborators": [3]}, "distributed.collaborators: must be"),
        ({"cache_dir": 3}, "distributed.cache_dir: must be"),
    ],
)
def test_new_distributed_keys_are_validated_in_one_line(raw, message):
    with pytest.raises(ConfigError) as info:
        SpeedtronicConfig.from_dict({"distributed": raw})
    (problem,) = info.value.problems
    assert problem.startswith(message) and "\n" not in problem


# ---------------------------------------------------------------------- open_transport


def test_open_transport_keeps_directories_local(tmp_path):
    assert isinstance(open_transport(str(tmp_path)), LocalTransport)
    assert isinstance(open_transport(f"file://{tmp_path}"), LocalTransport)
    assert isinstance(open_transport("./rel/dir", object()), LocalTransport)


def test_open_transport_builds_a_hub_transport_without_a_request(monkeypatch, tmp_path):
    def no_network(*args, **kwargs):
        raise AssertionError("open_transport made a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    settings = SpeedtronicConfig.from_dict(
        {
            "distributed": {
                "node_id": "node-b",
                "token": "hf_secret_token",
                "cache_dir": str(tmp_path),
                "min_publish_interval_s": 5,
                "squash_every": 7,
            }
        }
    ).distributed
    transport = open_transport(REPO, settings)
    assert isinstance(transport, HubTransport)
    assert transport.describe() == f"hf://{REPO}"
    assert (transport.min_publish_interval_s, transport.squash_every) == (5.0, 7)
    assert transport.node_id == "node-b" and transport.client.repo_id == REPO
    assert "hf_secret_token" not in repr(transport.client)
    assert isinstance(open_transport(REPO), HubTransport)  # the one-argument form still works


def test_the_hub_backoff_cap_comes_from_the_environment_for_tests(monkeypatch):
    monkeypatch.delenv("SPEEDTRONIC_HUB_MAX_BACKOFF_S", raising=False)
    assert open_transport(REPO).client.max_backoff_s == 60.0
    monkeypatch.setenv("SPEEDTRONIC_HUB_MAX_BACKOFF_S", "1.5")
    assert open_transport(REPO).client.max_backoff_s == 1.5
    for bad in ("0", "-1", "soon", "1e9"):
        monkeypatch.setenv("SPEEDTRONIC_HUB_MAX_BACKOFF_S", bad)
        with pytest.raises(ConfigError, match="SPEEDTRONIC_HUB_MAX_BACKOFF_S: must be seconds"):
            open_transport(REPO)


@pytest.mark.parametrize("repo", ["not a repo", "a/b/c", "org/", "org/na..me"])
def test_open_transport_refuses_what_is_neither_a_directory_nor_a_repo_id(repo):
    with pytest.raises(ConfigError, match="neither a directory nor a Hugging Face Hub repo id"):
        open_transport(repo)


def test_directory_transports_never_import_huggingface_hub(tmp_path):
    code = (
        "import sys\n"
        "from speedtronic.distributed.repos import open_transport\n"
        f"open_transport({str(tmp_path)!r}).list_deltas()\n"
        "assert 'huggingface_hub' not in sys.modules\n"
    )
    done = proc_support.run([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr

"""DumbDiLoCo under a damaged or hostile repo (issue 17): strangers under ``nodes/``, every field
of ``step_count.json``, and what the master and workers do about them. Named after the
invariants of DESIGN.md section 5 they hold."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest
import torch
from diloco_support import Log, settings
from typer.testing import CliRunner

from diloco.test_nodes import FakeTrainer, master_loop, model, wait_for
from diloco.test_outer import assert_weights, make_delta
from diloco.test_outer import master as outer_master
from speedtronic.cli.app import app
from speedtronic.distributed.codec import encode_delta, encode_weights
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.plugin import serve
from speedtronic.distributed.master.repo import AnotherMaster
from speedtronic.distributed.node_status import Throttle
from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    STEP_COUNT,
    DeltaHeader,
    delta_path,
    parse_step_count,
)
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import TransportError
from speedtronic.observe.metrics import _diloco_line

runner = CliRunner()


def strangers_repo(root):
    """A repo whose ``nodes/`` holds one of every kind of entry that is no delta."""
    nodes = root / "nodes"
    (nodes / "node-a").mkdir(parents=True)
    (nodes / "node-a" / "notes.txt").write_text("hi")
    (nodes / "node-a" / "sub").mkdir()
    (nodes / "node-a" / "delta_00000009.safetensors").symlink_to("/etc/passwd")
    os.mkfifo(nodes / "node-a" / "delta_00000010.safetensors")
    (nodes / "stray.bin").write_bytes(b"x")
    (nodes / ".hidden").mkdir()
    (nodes / ".hidden" / "delta_1.safetensors").write_bytes(b"x")
    return LocalTransport(root)


def test_I4_a_directory_listing_names_every_stranger_with_its_reason(tmp_path):
    refs = strangers_repo(tmp_path).list_deltas()
    assert {r.path: r.problem for r in refs} == {
        "nodes/node-a/notes.txt": "not named delta_<digits>.safetensors",
        "nodes/node-a/sub": "a folder",
        "nodes/node-a/delta_00000009.safetensors": "a symbolic link",
        "nodes/node-a/delta_00000010.safetensors": "not a regular file",
        "nodes/stray.bin": "not inside a node's folder",
        "nodes/.hidden/delta_1.safetensors": "the folder '.hidden' is not a valid node id",
    }


def test_I4_the_master_logs_each_stranger_once_by_name_and_never_reads_it(tmp_path):
    transport, log = strangers_repo(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    for _ in range(3):
        loop.poll_once()
    ignored = [w for w in log.warnings if "ignoring" in w]
    assert len(ignored) == 6 and any("nodes/stray.bin: not inside" in w for w in ignored)
    assert loop.counters["found"] == 0 and loop.counters["rejected"] == 0


def test_I4_a_corrupt_delta_under_any_digits_name_is_rejected_by_name(tmp_path):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    transport.upload("nodes/evil/delta_500.safetensors", b"\x07" * 70)
    loop.poll_once()
    assert any("rejected nodes/evil/delta_500.safetensors" in w for w in log.warnings)
    assert loop.counters["rejected"] == 1


GOOD = {"outer_step": 3, "updated_at": "2026-01-01T00:00:00Z", "weights_sha256": "a" * 64}


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"nodes": [1]}, "nodes: must be an object"),
        ({"nodes": {"a": [1]}}, "must be a node id with an object"),
        ({"nodes": {"../x": {}}}, "must be a node id"),
        ({"nodes": {"a": {"seq": "1"}}}, "nodes.a.seq '1': must be an integer"),
        ({"fleet_tokens_per_step": "x"}, "fleet_tokens_per_step 'x': must be an integer"),
        ({"fleet_tokens_per_step": -1}, "fleet_tokens_per_step -1"),
        ({"outer_step": True}, "outer_step True"),
        ({"outer_step": 2**63}, "must be at most 999999999999999999"),
        ({"outer_step": 10**18}, "must be at most 999999999999999999"),
        ({"nodes": {"a": {"seq": 10**18}}}, "nodes.a.seq 1000000000000000000: must be at"),
        ({"nodes": {"a": {"seq": 1, "later": 2}}}, "nodes.a: unknown field 'later'"),
        ({"fleet_tokens": "x"}, "unknown field 'fleet_tokens'"),
        ({"format": 2}, "format 2: this node reads format 1"),
        ({"weights_key": "global/weights/000000000004-" + "a" * 16 + ".safetensors"}, "names"),
        ({"weights_sha256": "zz"}, "weights_sha256"),
        ({"updated_at": {"a": 1}}, "updated_at"),
        ({"ended": "yes"}, "ended 'yes': must be true or false"),
        ({"ended": 1}, "ended 1: must be true or false"),
    ],
)
def test_I4_every_step_count_field_is_type_and_range_checked(change, reason):
    with pytest.raises(TransportError, match=reason.replace("*", r"\*")) as info:
        parse_step_count(json.dumps({**GOOD, **change}).encode())
    assert str(info.value).startswith(STEP_COUNT)


def test_I4_a_step_count_of_known_fields_parses_whole():
    nodes = {"a": {"seq": 1, "base_outer_step": 2, "tokens": 3, "last_delta_at": "t"}}
    full = {**GOOD, "nodes": nodes, "format": 1, "master": "0" * 16, "fleet_tokens_per_step": 7}
    full["ended"] = True  # the run's end (issue 55); a file without it reads as before
    full["weights_key"] = f"global/weights/000000000003-{'a' * 16}.safetensors"
    assert parse_step_count(json.dumps(full).encode()) == full


# ---- I2: a node's consecutive deltas add up ------------------------------------------------


def chained(node: str, n: int, step: float, chain: str = "c0ffee00"):
    """``n`` consecutive deltas of one node's chain, each moving every weight by ``step``."""
    return [make_delta(node, seq, 0, 10, [step, step], [step], chain) for seq in range(1, n + 1)]


def test_I2_a_round_adds_up_one_nodes_consecutive_deltas_instead_of_averaging_them():
    """The issue's reproduction: a paused master finds 40 deltas of its only node."""
    m = outer_master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    for delta in chained("n1", 40, 0.01):
        assert m.offer(delta, now=0.0) == "accepted"
    result = m.round(now=0.0)
    assert result.counts["included"] == 40
    # All forty increments: w -= 40 * 0.01 = 0.4 (their mean would have moved 0.01).
    assert_weights(result.weights, {"a": [0.6, 1.6], "b": [0.1]})


def test_I2_nodes_are_averaged_with_each_other_after_each_nodes_increments_add_up():
    m = outer_master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    for delta in chained("n1", 3, 0.1) + chained("n2", 1, 0.5, chain="0badcafe"):
        m.offer(delta, now=0.0)
    # n1 moved 0.3 in three loops, n2 0.5 in one: equal per-loop tokens, so the fleet's
    # step is their mean, 0.4.
    assert_weights(m.round(now=0.0).weights, {"a": [0.6, 1.6], "b": [0.1]})


def test_I2_a_partial_round_applies_the_summed_node_at_its_share_of_the_fleet():
    m = outer_master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    m.offer(make_delta("n1", 1, 0, 10, [0.0, 0.0], [0.0], "c0ffee00"), now=0.0)
    m.offer(make_delta("n2", 1, 0, 10, [0.0, 0.0], [0.0], "0badcafe"), now=0.0)
    m.round(now=0.0)  # both nodes are the fleet now
    for delta in chained("n1", 4, 0.1)[1:]:  # n1's next three loops, while n2 is away
        m.offer(delta, now=1.0)
    # n1 is half the fleet: its 0.3 counts half, 0.15.
    assert_weights(m.round(now=1.0).weights, {"a": [0.85, 1.85], "b": [0.35]})


# ---- I3: the master's own state is the source of truth -------------------------------------


def run_master_to(tmp_path, transport, log, steps: int):
    """A master whose rounds each apply one crafted delta of node-a; returns the loop and the
    global's bytes at every outer step."""
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    published = {0: (transport.root / GLOBAL_WEIGHTS).read_bytes()}
    for seq in range(1, steps + 1):
        upload_delta(transport, seq, base=seq - 1, move=0.01)
        assert loop.poll_once().outer_step == seq
        published[seq] = (transport.root / GLOBAL_WEIGHTS).read_bytes()
    return loop, published


def upload_delta(transport, seq, base, move, node="node-a"):
    header = DeltaHeader(node, seq, base, 2, 20, "fp32", "2026-01-01T00:00:00Z", "c0ffee00")
    transport.upload(
        delta_path(node, seq), encode_delta({"weight": torch.full((1, 2), move)}, header)
    )


def published_step(repo):
    return json.loads((repo / STEP_COUNT).read_text())["outer_step"]


def test_I3_a_restart_over_step_one_weights_and_a_huge_step_count_keeps_its_own_state(tmp_path):
    """Issue 17, defect 2: it went back to step 1, then wedged refusing to save step 5."""
    repo, log = tmp_path / "repo", Log()
    transport = LocalTransport(repo)
    _, published = run_master_to(tmp_path, transport, log, steps=3)
    (repo / GLOBAL_WEIGHTS).write_bytes(published[1])
    (repo / STEP_COUNT).write_text(json.dumps({"outer_step": 1_000_000}))
    restarted_log = Log()
    restarted = master_loop(tmp_path, transport, restarted_log)
    restarted.start()
    assert restarted.master.outer_step == 3 and published_step(repo) == 3
    assert (repo / GLOBAL_WEIGHTS).read_bytes() == published[3]  # a step means the same weights
    assert any(
        "damaged" in w and "step_count.json says 1000000" in w for w in restarted_log.warnings
    )
    upload_delta(transport, 4, base=3, move=0.01)
    assert restarted.poll_once().outer_step == 4  # not wedged


def test_I3_a_genuine_global_under_an_inflated_step_count_is_republished_not_adopted(tmp_path):
    repo, log = tmp_path / "repo", Log()
    transport = LocalTransport(repo)
    _, published = run_master_to(tmp_path, transport, log, steps=2)
    counted = json.loads((repo / STEP_COUNT).read_text())
    (repo / STEP_COUNT).write_text(json.dumps({**counted, "outer_step": 1_000_000}))
    restarted = master_loop(tmp_path, transport, Log())
    restarted.start()
    assert restarted.master.outer_step == 2 and published_step(repo) == 2
    assert (tmp_path / "state").is_dir() and list((tmp_path / "state").glob("step_*.json"))
    upload_delta(transport, 3, base=2, move=0.01)  # a new worker's delta is not "too stale"
    assert restarted.poll_once().counts["included"] == 1


def damage(kind, repo):
    """Damage the repo's global/ one way; returns the file name a log line must name."""
    step_count, global_dir = repo / STEP_COUNT, repo / "global"
    if kind == "bad json":
        step_count.write_text("{not json")
    elif kind == "fifo":
        step_count.unlink()
        os.mkfifo(step_count)
    elif kind == "symlink":
        step_count.unlink()
        step_count.symlink_to("/etc/hostname")
    elif kind == "directory":
        step_count.unlink()
        step_count.mkdir()
    elif kind == "global is a file":
        shutil.rmtree(global_dir)
        global_dir.write_text("x")
        return "global/"
    elif kind == "garbage weights":
        (repo / GLOBAL_WEIGHTS).write_bytes(b"garbage" * 10)
        return GLOBAL_WEIGHTS
    return STEP_COUNT


DAMAGE = ["bad json", "fifo", "symlink", "directory", "global is a file", "garbage weights"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_I3_a_master_with_its_state_republishes_over_a_damaged_global(tmp_path, kind):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    _, published = run_master_to(tmp_path, transport, Log(), steps=2)
    named = damage(kind, repo)
    log = Log()
    restarted = master_loop(tmp_path, transport, log)
    restarted.start()  # exit 1 before, for each of these
    assert published_step(repo) == 2 and (repo / GLOBAL_WEIGHTS).read_bytes() == published[2]
    [line] = [w for w in log.warnings if "damaged" in w]
    assert named in line and "republishing" in line and ": 3" not in line


def test_I3_a_deleted_global_is_restored_while_the_master_runs(tmp_path):
    repo, log = tmp_path / "repo", Log()
    transport = LocalTransport(repo)
    loop, published = run_master_to(tmp_path, transport, log, steps=2)
    shutil.rmtree(repo / "global")
    loop.guard.interval_s = 0.0  # every poll looks (a minute at most in a real run)
    loop.poll_once()
    assert published_step(repo) == 2 and (repo / GLOBAL_WEIGHTS).read_bytes() == published[2]
    assert any("step_count.json is missing" in w and "publishing" in w for w in log.warnings)


def test_I3_a_look_at_the_repo_overtaken_by_the_masters_own_publish_asks_for_no_other(tmp_path):
    """The Hub e2e run's CI failure ('publish outer step 2' committed twice): the poll thread's
    periodic look began while the sender's publish of step 2 was on its way, so it compared the
    repo (step 2, landed) with step 1's count and asked for step 2 to be published again, after
    the send had landed. Its own publish landing is nothing to publish again."""
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    loop, _ = run_master_to(tmp_path, transport, Log(), steps=1)
    before = loop.publisher.last_count  # what the look read before the send landed
    upload_delta(transport, 2, base=1, move=0.01)
    assert loop.poll_once().outer_step == 2  # the send landed
    assert not loop.guard.check(before, loop.publisher.saved_step, loop.intake.max_bytes)
    assert not loop.publisher.outstanding and published_step(repo) == 2


class LandsBeforeItReturns(LocalTransport):
    """A publish that has landed while its answer is still on its way (a slow link)."""

    def __init__(self, root):
        super().__init__(root)
        self.published: list[int] = []

    def publish(self, data, step_count, consumed):
        super().publish(data, step_count, consumed)
        self.published.append(step_count["outer_step"])
        time.sleep(0.1)


def test_I3_a_look_at_the_repo_during_a_publish_in_flight_republishes_nothing(tmp_path):
    """The same race with real threads: the sender's publish lands, the poll thread's look
    (slower than that) reads it, the send returns, then the look ends. Before: each step was
    published two or three times ([0, 1, 1, 2, 2, 3, 3, 3]); now once each."""
    transport = LandsBeforeItReturns(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    loop.start_sending()
    inspect = loop.guard.inspect

    def slow_look(*args, **kwargs):
        view = inspect(*args, **kwargs)
        time.sleep(0.2)
        return view

    loop.guard.inspect, loop.guard.interval_s = slow_look, 0.0
    try:
        for seq in (1, 2, 3):
            upload_delta(transport, seq, base=seq - 1, move=0.01)
            deadline = time.monotonic() + 60
            while loop.master.outer_step < seq and time.monotonic() < deadline:
                loop.poll_safely()
                time.sleep(0.02)
            for _ in range(5):  # polls while the step's publish is in flight and after
                loop.poll_safely()
                time.sleep(0.02)
    finally:
        loop.stop_sending(timeout=30)
    assert transport.published == [0, 1, 2, 3]


def test_I3_a_second_master_on_a_directory_is_refused_in_one_line(tmp_path):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    first, _ = run_master_to(tmp_path, transport, Log(), steps=2)
    other_state = tmp_path / "other"
    other_state.mkdir()
    (other_state / "x").write_text("")  # a state dir of its own, but no state in it
    second = MasterLoop(settings(), {"weight": torch.ones(1, 2)}, transport, Log(), other_state)
    second.start()  # no state: continues from the repo (a master on a new machine)
    upload_delta(transport, 3, base=2, move=0.01)
    second.poll_once()  # it publishes outer step 3 under its own id
    first.guard.interval_s = 0.0
    with pytest.raises(AnotherMaster, match="only one master may run") as info:
        first.poll_once()
    assert info.value.permanent and "\n" not in str(info.value)
    assert first.poll_safely() is None and first.fatal is not None  # the thread stops the run


class Unreachable(LocalTransport):
    """A repo that does not answer until ``up`` is set."""

    up = False

    def read_step_count(self):
        if not self.up:
            raise TransportError("503 Service Unavailable")
        return super().read_step_count()

    def list_deltas(self):
        if not self.up:
            raise TransportError("503 Service Unavailable")
        return super().list_deltas()


def test_I3_a_master_without_state_publishes_nothing_until_the_repo_answers(tmp_path):
    repo = tmp_path / "repo"
    run_master_to(tmp_path / "before", LocalTransport(repo), Log(), steps=2)  # another life
    transport, log = Unreachable(repo), Log()
    loop = master_loop(tmp_path, transport, log)  # a new machine: no state
    loop.start()
    assert loop.poll_safely() is None and published_step(repo) == 2  # no step 0 over step 2
    assert any("cannot read the repo at start" in w for w in log.warnings)
    transport.up = True
    loop.poll_once()
    assert loop.master.outer_step == 2 and published_step(repo) == 2


# ---- I4 and I5 on the node side ------------------------------------------------------------


def started_worker(transport, log):
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, log), FakeTrainer(net)
    worker.on_train_start(trainer)
    return worker, trainer, net


@pytest.mark.parametrize(
    "body, field",
    [
        ({"outer_step": 0, "nodes": [1]}, "nodes"),
        ({"outer_step": 7, "fleet_tokens_per_step": "x"}, "fleet"),
    ],
)
def test_I4_a_worker_keeps_training_over_a_malformed_step_count(tmp_path, body, field):
    """Issue 17, defect 5: AttributeError / TypeError killed the worker (exit 1)."""
    transport, log = LocalTransport(tmp_path), Log()
    worker, trainer, net = started_worker(transport, log)
    transport.publish(b"unused", {"outer_step": 0}, [])
    (tmp_path / STEP_COUNT).write_text(json.dumps(body))
    worker.fetcher.refresh()
    for _ in range(4):
        trainer.train_step(worker)  # two boundaries
    worker.on_train_end(trainer, None)
    named = [w for w in log.warnings if f"could not fetch the global weights ({STEP_COUNT}: " in w]
    assert any(f"{STEP_COUNT}: {field}" in w for w in named) and worker.base_outer_step == -1


def test_I4_issue27_defect8_an_ill_typed_unknown_field_is_named_and_the_last_good_global_kept(
    tmp_path,
):
    """Issue 27, defect 8: ``"fleet_tokens": "x"`` was dropped unread and the global installed."""
    transport, log = LocalTransport(tmp_path), Log()
    worker, trainer, net = started_worker(transport, log)
    transport.publish(encode_weights({"weight": torch.full((1, 2), 2.0)}, 1), {"outer_step": 1}, [])
    worker.fetcher.refresh()
    trainer.train_step(worker)
    trainer.train_step(worker)  # a boundary: installs step 1
    assert worker.base_outer_step == 1
    bad = encode_weights({"weight": torch.full((1, 2), 3.0)}, 2)
    transport.publish(bad, {"outer_step": 2, "fleet_tokens": "x"}, [])
    worker.fetcher.refresh()
    trainer.train_step(worker)
    trainer.train_step(worker)
    assert worker.base_outer_step == 1 and net.weight.max() < 2.5  # the last good one kept
    [line] = [w for w in log.warnings if "fleet_tokens" in w]
    assert f"{STEP_COUNT}: unknown field 'fleet_tokens'" in line and "\n" not in line
    worker.status.stop.set()


def test_I4_a_global_of_huge_finite_values_is_refused_by_name(tmp_path):
    transport, log = LocalTransport(tmp_path), Log()
    worker, trainer, net = started_worker(transport, log)
    huge = encode_weights({"weight": torch.full((1, 2), 1e30)}, 1)
    transport.publish(huge, {"outer_step": 1}, [])
    worker.fetcher.refresh()
    trainer.train_step(worker)
    trainer.train_step(worker)  # a boundary: nothing to install
    assert worker.base_outer_step == -1 and net.weight.abs().max() < 10
    assert any("implausible weights" in w for w in log.warnings)
    worker.status.stop.set()


def test_I5_a_failure_repeating_at_every_poll_is_said_once_a_minute():
    now = [0.0]
    throttle = Throttle(60.0, clock=lambda: now[0])
    said = []
    for _ in range(300):  # a minute of polls at 0.2 s
        said.append(throttle.line("poll failed (nodes is a file)"))
        now[0] += 0.2
    said.append(throttle.line("poll failed (nodes is a file)"))
    lines = [s for s in said if s]
    assert lines == [
        "poll failed (nodes is a file)",
        "poll failed (nodes is a file) (299 more like it in 60 s)",
    ]


def test_I5_the_master_thread_survives_any_exception_a_transport_raises(tmp_path):
    class Broken(LocalTransport):
        def list_deltas(self):
            raise RuntimeError("Error while uploading 'x' to the Hub.")

    log = Log()
    loop = master_loop(tmp_path, Broken(tmp_path / "repo"), log)
    loop.start()
    for _ in range(50):
        assert loop.poll_safely() is None
    assert loop.fatal is None
    failed = "poll failed (RuntimeError(\"Error while uploading 'x' to the Hub.\")); retrying"
    assert [w for w in log.warnings if "poll failed" in w] == [f"diloco master: {failed}"]


def test_the_round_line_says_what_the_momentum_did():
    base = {"outer_step": 3, "included": 2, "stale": 0, "bad": 0, "tokens": 10}
    line = _diloco_line("diloco_round", {**base, "momentum": False, "momentum_state": "off"})
    assert "no outer momentum (plain averaging)" in line and "partial" not in line
    pending = _diloco_line("diloco_round", {**base, "momentum": False, "momentum_state": "pending"})
    assert "outer momentum pending" in pending


# ---- bad --repo targets: exit 2 at start, one line -----------------------------------------


@pytest.mark.parametrize(
    "repo, reason",
    [
        ("/proc", "a system directory"),
        ("file://", "names no directory"),
        ("/", "the filesystem root"),
        ("{file}", "is a file, not a directory"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_repo_no_node_could_use_is_exit_2_at_start(tmp_path, repo, reason, command):
    path = tmp_path / "a-file"
    path.write_text("x")
    sets = ["run.max_steps=1", f"run.output_dir={tmp_path / 'run'}", "distributed.enabled=true"]
    sets.append(f"distributed.repo_id={repo.format(file=path)}")
    args = [command] + [a for kv in sets for a in ("--set", kv)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    [line, *_] = result.stderr.splitlines()
    assert line.startswith("speedtronic: error: distributed.repo_id:") and reason in line
    assert "Traceback" not in result.stderr and not (tmp_path / "nodes").exists()


def test_I2_an_install_reapplies_every_own_delta_the_global_does_not_name_as_included(tmp_path):
    """A global naming seq 1 included lacks seq 2 (sent) and 3 (just queued): both come back
    at the node's share, so the next deltas do not drop seq 2's work."""
    transport, log = LocalTransport(tmp_path), Log()
    net = model(1.0)
    worker = WorkerPlugin(settings(reapply_own_delta=True), net, transport, log, background=False)
    trainer = FakeTrainer(net)
    worker.on_train_start(trainer)
    for _ in range(2):  # seq 1 and seq 2, each -0.25 x 2 steps
        trainer.train_step(worker, move=-0.25)
        trainer.train_step(worker, move=-0.25)
        worker.uploader.send_pending()
    global_weights = encode_weights({"weight": torch.full((1, 2), 0.5)}, 1)
    nodes = {"node-a": {"seq": 1, "base_outer_step": 0, "tokens": 20, "last_delta_at": "t"}}
    transport.publish(
        global_weights, {"outer_step": 1, "fleet_tokens_per_step": 10, "nodes": nodes}, []
    )
    worker.fetcher.refresh()
    trainer.train_step(worker, move=-0.25)
    trainer.train_step(worker, move=-0.25)  # seq 3 queued, then the install
    # 0.5 (with seq 1) minus seq 2 (0.5) and seq 3 (0.5) at share 20/20: -0.5
    assert worker.base_outer_step == 1
    assert torch.allclose(net.weight, torch.full((1, 2), -0.5))


def test_I2_a_single_node_installs_change_nothing_however_uploads_and_rounds_interleave(tmp_path):
    """One worker, a master applying each delta in full: every install must leave the weights
    where they were (the global is the node's own work), also when failed uploads were folded
    (a delta of two loops must not halve the node's share) and rounds lag uploads."""
    import random

    torch.manual_seed(0)
    net = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    transport = LocalTransport(tmp_path / "repo")
    config = settings(inner_steps=5, reapply_own_delta=True, reset_inner_optimizer=False)
    weights = {k: v.detach().clone() for k, v in net.named_parameters()}
    loop = MasterLoop(config, weights, transport, Log(), tmp_path / "state")
    loop.start()
    worker = WorkerPlugin(config, net, transport, Log(), background=False)
    trainer = FakeTrainer(net)
    trainer.optimizer = optimizer
    worker.on_train_start(trainer)
    rng, x = random.Random(1), torch.randn(64, 8)
    for _ in range(200):
        loss = ((net(x) - x.flip(1)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trainer.step, trainer.tokens = trainer.step + 1, trainer.tokens + 256
        before = net.weight.detach().clone()
        worker.after_optimizer_step(trainer)
        torch.testing.assert_close(net.weight, before, rtol=0, atol=1e-5)
        for chance, act in ((0.3, worker.uploader.send_pending), (0.2, loop.poll_once)):
            if rng.random() < chance:
                act()
        if rng.random() < 0.3:
            worker.fetcher.refresh()
    assert worker.base_outer_step >= 10  # it did install, many times


def test_I3_a_restart_keeps_the_nodes_applied_seqs_and_the_fleets_pace_from_its_state(
    tmp_path,
):
    """A restarted master republished the repo's (tampered, or older) ``nodes`` summary and a
    fleet pace of 0, so a node reapplied deltas the global held, or none it lacked: the chaos
    run's global drifted 1.5 from the worker's own weights in 2 runs of 5."""
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    run_master_to(tmp_path, transport, Log(), steps=3)
    before = json.loads((repo / STEP_COUNT).read_text())
    (repo / STEP_COUNT).write_text(json.dumps({"outer_step": 1_000_000}))
    restarted = master_loop(tmp_path, transport, Log())
    restarted.start()
    after = json.loads((repo / STEP_COUNT).read_text())
    assert after["fleet_tokens_per_step"] == before["fleet_tokens_per_step"] == 10
    node = {"seq": 3, "base_outer_step": 2, "tokens": 20, "last_delta_at": "2026-01-01T00:00:00Z"}
    node.update({"final": False, "chain": "c0ffee00"})
    node.update({"steps_total": 3 * 2, "tokens_total": 3 * 20})  # three deltas of 2 steps
    assert after["nodes"] == before["nodes"] == {"node-a": node}


# ---- issue 19: a publish that does not block polling --------------------------------------


class SlowPublish(LocalTransport):
    """Publishes block until ``release`` is set; the first ``fail`` of them raise."""

    def __init__(self, root, fail=0):
        super().__init__(root)
        self.release, self.fail, self.published = threading.Event(), fail, []

    def publish(self, weights, step_count, consumed):
        self.release.wait(30)
        if self.fail:
            self.fail -= 1
            raise TransportError("503 Service Unavailable")
        super().publish(weights, step_count, consumed)
        self.published.append(step_count["outer_step"])


def test_polls_go_on_while_a_publish_is_in_flight_and_rounds_wait_for_it_to_land(tmp_path):
    """Issue 27: a round that has not landed must not move the step on for anyone; the polls
    go on (deltas are fetched and offered), the next round waits, then takes them all."""
    transport = SlowPublish(tmp_path / "repo")
    transport.release.set()
    loop = master_loop(tmp_path, transport, Log())
    loop.start()  # step 0, synchronously
    transport.release.clear()
    transport.fail = 1
    loop.start_sending()
    upload_delta(transport, 1, base=0, move=0.01)
    assert loop.poll_once().outer_step == 1
    for seq in (2, 3):  # two more polls while the first publish hangs
        upload_delta(transport, seq, base=0, move=0.01)
        assert loop.poll_once() is None  # the poll returns: nothing blocks it, no round runs
    assert loop.master.outer_step == 1 and loop.master.pending == 2
    transport.release.set()
    assert wait_for(lambda: transport.published == [0, 1])  # its send failed once, then landed
    assert wait_for(lambda: loop.poll_once() is not None)  # now the round with 2 and 3
    loop.stop_sending(timeout=30)
    assert transport.published == [0, 1, 2] and published_step(tmp_path / "repo") == 2
    assert not list((tmp_path / "repo").glob("nodes/*/delta_*"))  # every round's deletes done


def test_a_close_waits_through_a_failed_sends_retry_and_the_step_lands(tmp_path):
    """close() saw the sender idle during a failed send's retry wait and gave up at once."""
    transport = SlowPublish(tmp_path / "repo")
    transport.release.set()
    loop = master_loop(tmp_path, transport, Log(), poll_interval=0.5)  # the retry wait
    loop.start()
    transport.fail = 1
    loop.start_sending()
    upload_delta(transport, 1, base=0, move=0.01)
    assert loop.poll_once().outer_step == 1
    loop.stop_sending(timeout=30)
    assert transport.published == [0, 1] and not loop.unpublished


def saved_round(loop, transport, seq):
    upload_delta(transport, seq, base=seq - 1, move=0.01)
    loop.intake.poll(loop.master)
    result = loop.master.propose(0.0, force=True)
    saved = loop.publisher.save(result.state(), [], {}, result.fleet_rate)
    loop.master.commit(result)
    return saved


def test_an_older_step_landing_neither_clears_a_newer_saved_one_nor_lands_over_it(tmp_path):
    """The sender's thread landing step N must not mark step N+1, saved meanwhile, as
    published; and N never lands after N+1 (a timed-out close left N in flight)."""
    transport = SlowPublish(tmp_path / "repo")
    transport.release.set()
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    first, second = saved_round(loop, transport, 1), saved_round(loop, transport, 2)
    live = loop.master.global_weights["weight"]
    assert first.weights["weight"].data_ptr() != live.data_ptr()  # a copy: rounds go on
    assert loop.publisher.send(first) and loop.unpublished  # step 2 is only in state_dir
    assert loop.publisher.send(second) and not loop.unpublished
    assert not loop.publisher.send(first)  # superseded: skipped
    assert transport.published == [0, 1, 2] and published_step(tmp_path / "repo") == 2


def test_a_coordinating_master_whose_last_step_cannot_land_does_not_exit_0(tmp_path):
    transport = SlowPublish(tmp_path / "repo")
    transport.release.set()
    loop = master_loop(tmp_path, transport, Log(), upload_timeout_s=0.3, poll_interval=0.05)
    loop.start()
    transport.fail = 10**6
    upload_delta(transport, 1, base=0, move=0.01)
    with pytest.raises(TransportError, match="outer step 1 is saved in .* could not be published"):
        serve(loop, outer_steps=1, stop=threading.Event())


def test_I2_a_single_node_install_is_exact_when_a_global_cuts_a_merged_run(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    net = model(1.0)
    config = settings(inner_steps=1, reapply_own_delta=True)
    worker = WorkerPlugin(config, net, transport, Log(), background=False)
    trainer = FakeTrainer(net)
    worker.on_train_start(trainer)

    def boundary(move):
        trainer.train_step(worker, move=move)  # inner_steps 1: every step is a boundary
        worker.uploader.send_pending()

    boundary(-0.5)
    boundary(-0.25)
    assert loop.poll_once().outer_step == 1  # holds deltas 1 and 2
    for move in (-0.125, -0.0625, -0.03125):  # 5 out: 3 in memory, 2 spilled to disk
        boundary(move)
    records = worker.uploader.in_flight.records
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert [r.name is not None for r in records] == [False, False, False, True, True]
    worker.fetcher.refresh()
    before = net.weight.detach().clone()
    boundary(0.0)  # global 1: the node's own work, so the weights must not move
    # exact: the records the global lacks, as sent (a share by count moved them by 0.17)
    torch.testing.assert_close(net.weight, before, rtol=0, atol=1e-6)
    assert [r.seq for r in worker.uploader.in_flight.records] == [3, 4, 5, 6]

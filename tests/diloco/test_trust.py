"""A repo writer cannot cut a node off (issue 27, defects 2-4): consistent, well-formed files
under absurd steps or edited fields, deletes through a folder swapped for a link, globals grown
a little at each publish. Each test ends with every node back in the run: the master on its own
trajectory and a worker's next delta applied. Named after the invariants of DESIGN.md section 5
they hold."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading

import pytest
import safetensors.torch
import torch
from diloco_support import Log, settings

from diloco.test_faults import run_master_to, upload_delta
from diloco.test_nodes import FakeTrainer, master_loop, model
from speedtronic.distributed.codec import encode_weights
from speedtronic.distributed.master.plugin import serve
from speedtronic.distributed.master.repo import AnotherMaster
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, parse_delta_path
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin


def forge(repo, weights: bytes, step: int, master: str | None = "keep", **fields) -> None:
    """The issue's writer: the global copied under ``step``, with a consistent step_count.json
    (the sha256 of the copy, the master's id unless ``master`` says otherwise)."""
    counted = json.loads((repo / STEP_COUNT).read_text())
    data = encode_weights(safetensors.torch.load(weights), step)  # any model's
    counted.update(outer_step=step, weights_sha256=hashlib.sha256(data).hexdigest(), **fields)
    if master is None:
        counted.pop("master")
    elif master != "keep":
        counted["master"] = master
    (repo / GLOBAL_WEIGHTS).write_bytes(data)
    (repo / STEP_COUNT).write_text(json.dumps(counted))


def counted(repo) -> dict:
    return json.loads((repo / STEP_COUNT).read_text())


def joined_worker(transport, node="worker-1"):
    """A worker driven by hand (no threads): installs at its boundaries (inner_steps 2)."""
    net, log = model(1.0), Log()
    worker = WorkerPlugin(settings(node_id=node), net, transport, log, background=False)
    trainer = FakeTrainer(net)
    worker.on_train_start(trainer)
    return worker, trainer, log


def inner_loop(worker, trainer):
    """One inner loop: a boundary (its delta queued, a waiting global installed), then sent."""
    worker.fetcher.refresh()
    trainer.train_step(worker, move=-0.01)
    trainer.train_step(worker, move=-0.01)
    worker.uploader.send_pending()


def assert_back_in_the_run(loop, worker, trainer):
    """The worker installs the master's global and its next delta is applied in a round."""
    loop.guard.interval_s = 0.0
    loop.poll_once()  # the master looks at the repo (restores it) and takes what arrived
    inner_loop(worker, trainer)  # installs the master's global at this boundary
    assert worker.base_outer_step == loop.master.outer_step
    inner_loop(worker, trainer)  # a delta trained from it
    step = loop.master.outer_step
    result = loop.poll_once()
    assert result is not None and result.outer_step == step + 1
    assert any(i.startswith(f"{worker.node_id}/") for i in result.included)
    assert counted(loop.transport.root)["outer_step"] == step + 1


# ---- defect 2: consistent, well-formed files under absurd steps -------------------------------


def test_I3_issue27_2a_a_global_copied_under_step_1e15_with_the_masters_id_cuts_no_one_off(
    tmp_path,
):
    repo = tmp_path / "repo"
    transport, log = LocalTransport(repo), Log()
    loop, published = run_master_to(tmp_path, transport, log, steps=4)
    worker, trainer, worker_log = joined_worker(transport)
    assert worker.base_outer_step == 4
    forge(repo, published[4], 10**15)
    inner_loop(worker, trainer)  # the worker installs the copy: it cannot tell it apart
    assert worker.base_outer_step == 10**15
    loop.guard.interval_s = 0.0
    loop.poll_once()  # the master: not its publish (past its saved state); its own again
    [line] = [w for w in log.warnings if str(10**15) in w]
    assert STEP_COUNT in line and "past its newest saved state" in line and "\n" not in line
    assert counted(repo)["outer_step"] == loop.master.outer_step
    assert_back_in_the_run(loop, worker, trainer)  # before: never a lower step again
    [back] = [w for w in worker_log.warnings if "went back" in w]
    assert f"went back from outer step {10**15} to" in back and STEP_COUNT in back
    assert loop.counters["rejected"] <= 1  # at most the loop trained on the copy


def test_I3_issue27_2b_a_copy_that_names_no_master_neither_stops_nor_wedges_the_master(tmp_path):
    repo = tmp_path / "repo"
    transport, log = LocalTransport(repo), Log()
    loop, published = run_master_to(tmp_path, transport, log, steps=4)
    worker, trainer, _ = joined_worker(transport)
    forge(repo, published[4], 10**15, master=None)
    inner_loop(worker, trainer)
    loop.guard.interval_s = 0.0
    loop.poll_once()  # before: AnotherMaster, exit 1
    assert loop.fatal is None and counted(repo)["outer_step"] == loop.master.outer_step
    assert any("names no master: not a master's publish" in w for w in log.warnings)
    forge(repo, published[4], 10**15, master=None)  # again, and the master restarts over it
    restarted = master_loop(tmp_path, transport, Log())
    restarted.start()  # before: the same refusal at every restart
    assert restarted.master.outer_step == loop.master.outer_step == counted(repo)["outer_step"]
    assert_back_in_the_run(restarted, worker, trainer)


@pytest.mark.parametrize("step", [10**15, 10**18 - 1])
def test_I3_issue27_2c_a_restart_never_adopts_a_step_past_its_intact_state_dir(tmp_path, step):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    loop, published = run_master_to(tmp_path, transport, Log(), steps=4)
    worker, trainer, _ = joined_worker(transport)
    forge(repo, published[4], step)  # the master's id, in place while it restarts
    inner_loop(worker, trainer)
    log = Log()
    restarted = master_loop(tmp_path, transport, log)
    restarted.start()  # before: adopted 10**18 - 1, then published 19-digit steps
    assert restarted.master.outer_step == 4 and counted(repo)["outer_step"] == 4
    assert (repo / GLOBAL_WEIGHTS).read_bytes() == published[4]
    [line] = [w for w in log.warnings if str(step) in w]
    assert STEP_COUNT in line and "republishing this master's state (outer step 4)" in line
    assert_back_in_the_run(restarted, worker, trainer)


def test_I3_issue27_2c_a_coordinating_master_does_not_end_at_once_over_a_huge_step(tmp_path):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    _, published = run_master_to(tmp_path, transport, Log(), steps=2)
    forge(repo, published[2], 10**18 - 1)
    restarted = master_loop(tmp_path, transport, Log())
    stop = threading.Event()
    upload_delta(transport, 3, base=2, move=0.01)
    threading.Timer(0.5, stop.set).start()  # serve() until outer_steps or this
    serve(restarted, outer_steps=10, stop=stop)  # before: exit 0 at once (10**18 - 1 >= 10)
    assert restarted.master.outer_step == 3 and counted(repo)["outer_step"] == 3


def test_I3_a_master_whose_newest_state_is_damaged_still_continues_from_its_own_publish(
    tmp_path,
):
    """What adoption is for: a publish follows its save, so a damaged newest manifest means the
    repo may hold this master's later step; it is taken, but never past that manifest."""
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    run_master_to(tmp_path, transport, Log(), steps=3)
    (tmp_path / "state" / "step_0000000003.json").write_text("{torn")
    restarted = master_loop(tmp_path, transport, Log())
    restarted.start()
    assert restarted.master.outer_step == 3 and counted(repo)["outer_step"] == 3


def test_I3_a_damaged_newest_state_does_not_let_a_step_past_it_be_adopted(tmp_path):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    _, published = run_master_to(tmp_path, transport, Log(), steps=3)
    (tmp_path / "state" / "step_0000000003.json").write_text("{torn")
    forge(repo, published[3], 10**15)
    restarted = master_loop(tmp_path, transport, Log())
    restarted.start()  # no publish of its own is past step 3: not adopted
    assert restarted.master.outer_step == 2


def test_I3_another_masters_consistent_global_is_still_a_one_line_refusal(tmp_path):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    loop, published = run_master_to(tmp_path, transport, Log(), steps=2)
    forge(repo, published[2], 3, master="0123456789abcdef")
    loop.guard.interval_s = 0.0
    with pytest.raises(AnotherMaster, match="another master \\(0123456789abcdef\\)"):
        loop.poll_once()


@pytest.mark.parametrize("seq", [10**18 - 1, 10**17 - 1])
def test_I3_issue27_2d_an_edited_node_seq_is_restored_and_a_joining_worker_is_applied(
    tmp_path, seq
):
    repo = tmp_path / "repo"
    transport, log = LocalTransport(repo), Log()
    loop, _ = run_master_to(tmp_path, transport, log, steps=2)
    body = counted(repo)
    body["nodes"]["worker-1"] = {"seq": seq, "base_outer_step": 1, "tokens": 20}
    (repo / STEP_COUNT).write_text(json.dumps(body))
    worker, trainer, worker_log = joined_worker(transport)  # it reads the edited file
    inner_loop(worker, trainer)
    [ref] = [r for r in transport.list_deltas() if "worker-1" in r.path]
    assert ref.problem is None  # a name the master parses (before: 19 digits, ignored)
    loop.guard.interval_s = 0.0
    # the whole file is compared: the edit is named and undone (republished first: no round
    # runs while the repo lacks the saved step), then the joining worker's delta is applied
    result = loop.poll_once() or loop.poll_once()
    assert any(f"{STEP_COUNT} was edited" in w and "(nodes)" in w for w in log.warnings)
    assert result is not None and any(i.startswith("worker-1/") for i in result.included)
    assert counted(repo)["nodes"]["worker-1"]["seq"] == parse_delta_path(ref.path)[1]
    if seq > 10**17:  # no room to number on: the worker says so and numbers on from its own
        assert any("leaves no room" in w for w in worker_log.warnings)


def test_I3_a_master_restarted_over_an_edited_node_summary_republishes_its_own(tmp_path):
    repo = tmp_path / "repo"
    transport = LocalTransport(repo)
    run_master_to(tmp_path, transport, Log(), steps=2)
    mine = counted(repo)["nodes"]
    body = counted(repo)
    body["nodes"]["node-a"]["seq"] = 10**17 - 1
    (repo / STEP_COUNT).write_text(json.dumps(body))
    log = Log()
    restarted = master_loop(tmp_path, transport, log)
    restarted.start()
    assert counted(repo)["nodes"] == mine and counted(repo)["outer_step"] == 2
    assert any("differs from this master's state" in w and "nodes" in w for w in log.warnings)


# ---- defect 3: deletes never leave the repo ------------------------------------------------


def rejected_in(transport, loop, node="evil"):
    """A bad delta the master rejected: its file is deleted with the next publish."""
    transport.upload(f"nodes/{node}/delta_00000001.safetensors", b"\x07" * 70)
    loop.poll_once()
    assert loop.intake.unusable == [f"nodes/{node}/delta_00000001.safetensors"]


@pytest.mark.parametrize("swapped", ["nodes/evil", "nodes"])
def test_I4_issue27_3_a_folder_swapped_for_a_link_makes_no_delete_outside_the_repo(
    tmp_path, swapped
):
    repo = tmp_path / "repo"
    transport, log = LocalTransport(repo), Log()
    loop, _ = run_master_to(tmp_path, transport, log, steps=1)
    rejected_in(transport, loop)
    victim = tmp_path / "victim"  # what the link points to: the same names, outside the repo
    (victim / "evil").mkdir(parents=True)
    for where in (victim, victim / "evil"):
        (where / "delta_00000001.safetensors").write_text("not the repo's")
    shutil.rmtree(repo / swapped)
    os.symlink(victim, repo / swapped)
    loop.republish()  # the next publish deletes what was settled
    assert (victim / "delta_00000001.safetensors").read_text() == "not the repo's"
    assert (victim / "evil" / "delta_00000001.safetensors").read_text() == "not the repo's"
    assert loop.intake.unusable == []  # settled: nothing of the repo's is left to delete
    if swapped == "nodes":  # nothing is listed through it either, and it is named once
        assert [(r.path, r.problem) for r in transport.list_deltas()] == [
            ("nodes", "a link or not a folder")
        ]


def test_I4_reads_and_writes_follow_no_link_at_any_depth(tmp_path):
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    transport = LocalTransport(repo)
    transport.publish(encode_weights({"weight": torch.ones(1, 2)}, 0), {"outer_step": 0}, [])
    elsewhere.mkdir()
    (elsewhere / "step_count.json").write_text(json.dumps({"outer_step": 99}))
    shutil.rmtree(repo / "global")
    (repo / "global").symlink_to(elsewhere)
    with pytest.raises(Exception, match="cannot read global/step_count.json"):
        transport.read_step_count()
    transport.upload("global/x", b"data")  # the link is replaced by a folder of the repo
    assert not (elsewhere / "x").exists() and (repo / "global").is_dir()
    assert json.loads((elsewhere / "step_count.json").read_text())["outer_step"] == 99


def test_I4_a_transport_refuses_to_delete_anything_but_a_delta(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    with pytest.raises(ValueError, match="refusing to delete 'global/step_count.json'"):
        transport.publish(b"w", {"outer_step": 1}, ["global/step_count.json"])
    assert not (tmp_path / "repo" / GLOBAL_WEIGHTS).exists()  # refused before anything landed


# ---- defect 4: a bound on a global's size that does not compound -----------------------------


def test_I4_issue27_4_globals_grown_9x_per_publish_are_refused_past_10x_of_the_nodes_own(
    tmp_path,
):
    transport = LocalTransport(tmp_path)
    worker, trainer, worker_log = joined_worker(transport)
    for step in range(1, 8):  # each 9x the one before: every one passed a 10x check on main
        weights = {"weight": torch.full((1, 2), 9.0**step)}
        transport.publish(encode_weights(weights, step), {"outer_step": step}, [])
        inner_loop(worker, trainer)
    assert worker.base_outer_step == 1  # 9x its own weights passed; 81x never did
    assert float(worker.params["weight"].detach().abs().max()) < 10.0
    refused = [w for w in worker_log.warnings if "implausible weights" in w]
    assert refused and all("this node's own weights at start" in w for w in refused)


def test_I4_a_global_whose_norm_moves_with_training_is_always_installed(tmp_path):
    """Honest training may grow a model's norm several times (8.8x in 1,000 steps at lr 3e-2
    without weight decay, docs/diloco.md): the bound grows with how far the node's own training
    moved its weights, which a writer's globals cannot add to."""
    transport = LocalTransport(tmp_path)
    worker, trainer, log = joined_worker(transport)
    for step in range(1, 13):  # the node's own loops move it 2 x 0.5 per weight each
        transport.publish(
            encode_weights({"weight": torch.full((1, 2), 2.0 * step)}, step),
            {"outer_step": step},
            [],
        )
        worker.fetcher.refresh()
        trainer.train_step(worker, move=0.5)
        trainer.train_step(worker, move=0.5)
    assert worker.base_outer_step == 12  # 24x the node's weights at start: installed
    assert not [w for w in log.warnings if "implausible" in w]


def test_I4_the_norm_anchor_and_the_travel_are_kept_across_a_resume(tmp_path):
    transport = LocalTransport(tmp_path)
    worker, trainer, _ = joined_worker(transport)
    transport.publish(encode_weights({"weight": torch.full((1, 2), 9.0)}, 1), {"outer_step": 1}, [])
    inner_loop(worker, trainer)
    inner_loop(worker, trainer)
    state = worker.state_dict()
    resumed, _, log = joined_worker(LocalTransport(tmp_path))
    resumed.load_state_dict(state)  # its weights are the 9x ones now; the anchor is not
    assert worker.fetcher.travel > 0 and resumed.fetcher.travel == worker.fetcher.travel
    transport.publish(
        encode_weights({"weight": torch.full((1, 2), 81.0)}, 2), {"outer_step": 2}, []
    )
    resumed.fetcher.refresh()
    assert resumed.fetcher.ready is None
    assert any("implausible weights" in w for w in log.warnings)


# ---- the issue's reproduction, with processes ------------------------------------------------


ROUND_RE = r"diloco round: outer step (\d+) \| deltas (\d+) in, (\d+) stale, (\d+) rejected"


@pytest.mark.slow
def test_I3_issue27_2a_processes_a_copied_global_under_1e15_costs_a_worker_seconds_not_its_run(
    tmp_path,
):
    """The issue's run: a master and a worker, ``speedtronic train`` each, on a directory; a
    writer copies the global under outer step 10**15 with the master's id. Before: 486 of the
    worker's 500 deltas rejected as ahead of the master's step, exit 0, nothing said."""
    import re
    import time

    import proc_support

    from diloco.test_e2e import log_of, start, wait_until

    repo = tmp_path / "repo"
    master = start(tmp_path, repo, "master", "master", 1, train_locally=False, min_deltas=1)
    worker = None
    try:
        assert wait_until(lambda: (repo / STEP_COUNT).exists(), watch=master)
        worker = start(tmp_path, repo, "worker", "worker-1", 1500, min_deltas=1)
        forged = f"global {10**15}"
        assert wait_until(
            lambda: (
                "diloco boundary at step 100 " in log_of(tmp_path, "worker-1")
                or worker.poll() is not None
            ),
            watch=worker,
        )
        began = time.monotonic()
        while forged not in (tmp_path / "worker-1.log").read_text() and worker.poll() is None:
            try:  # the master publishes every round: copy again until the worker took it
                forge(repo, (repo / GLOBAL_WEIGHTS).read_bytes(), 10**15)
            except (ValueError, OSError, KeyError):
                pass  # read mid-publish: the next try
            time.sleep(0.05)
        forged_after_s = time.monotonic() - began
        assert proc_support.wait(worker) == 0, log_of(tmp_path, "worker-1")
        text = (tmp_path / "worker-1.log").read_text()  # before: it never installed again
        assert f"went back from outer step {10**15}" in text, text[-3000:]
        # the worker's last delta ends the run: the coordinating master applies it and ends (I6)
        assert proc_support.wait(master) == 0, log_of(tmp_path, "master")
        assert not list(repo.glob("nodes/*/delta_*.safetensors")), log_of(tmp_path, "master")
    finally:
        for process in (master, worker):
            if process is not None and process.poll() is None:
                process.kill()
    assert forged in text, text[-3000:]
    master_text = (tmp_path / "master.log").read_text()
    rounds = [tuple(map(int, m)) for m in re.findall(ROUND_RE, master_text)]
    included, rejected = sum(r[1] for r in rounds), sum(r[3] for r in rounds)
    assert "names this master at outer step 1000000000000000" in master_text
    stale = sum(r[2] for r in rounds)
    # what the worker sent, not one file per boundary: on a loaded machine the uploader folds the
    # inner loops that queued behind a slow send into one delta (CI: 259 files for 300 loops)
    sent = max(int(n) for n in re.findall(r"\| uploads (\d+) \(", text))
    assert sent >= 1500 // 5 // 4, sent  # the worker did send its run, folded or not
    accounted = included + stale + rejected
    assert accounted >= sent * 0.9 and rejected <= sent // 2, (included, stale, rejected, sent)
    print(
        f"\nissue 27 2(a) with processes: {rejected} of {accounted} deltas rejected "
        f"as ahead of the master's step (on main 486 of 500), forged for {forged_after_s:.1f} s"
    )

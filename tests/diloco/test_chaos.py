"""DumbDiLoCo under chaos (issue 17): a coordinating master and a worker as ``speedtronic train``
processes on a directory, while the master is paused, killed and restarted, its ``global/``
deleted and its ``step_count.json`` tampered with.

Each disturbance must be named in a log line, no process may crash, the master's published
outer step never goes back, and no work is silently lost: the final global's held-out loss is
within noise of the same run undisturbed, and its step count holds the worker's last delta. The
master ends by itself once the worker's last delta is in (I6). Before issue 17, a master paused
for most of the run averaged the worker's 40 deltas into one (global loss 4.10 against 1.81
undisturbed); before issue 26, the worker's installs with more than 3 deltas out were corrected
by a share by count, and the final global ended ~0.1 above the worker's own loss 1 run in 4.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path

import pytest

from diloco.test_e2e import CONFIG, _reference, global_loss, log_of, start, wait_until
from speedtronic.distributed.codec import decode_weights
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT

STEPS = 600  # 120 deltas: the pause comes with dozens still to send, however fast the worker
TIMEOUT_S = 300  # a loaded 2-core CI machine; the run itself takes ~30 s


def run(tmp_path: Path, disturb) -> float:
    """Master and worker on ``tmp_path/repo``; ``disturb(tmp_path, repo, master) -> master``
    acts during the worker's run. Returns the final global's held-out loss."""
    repo = tmp_path / "repo"
    tmp_path.mkdir(parents=True, exist_ok=True)
    spawned = [start_master(tmp_path, repo)]
    try:
        master = spawned[0]
        assert wait_until(lambda: (repo / GLOBAL_WEIGHTS).exists(), TIMEOUT_S), log_of(
            tmp_path, "m"
        )
        # AdamW state kept at installs: with resets, fewer installs alone would change the
        # loss; the worker waits 2 s at most for a global with its last delta (the master may
        # be paused)
        keep = {"min_deltas": 1, "reset_inner_optimizer": False, "drain_timeout_s": 2.0}
        worker = start(tmp_path, repo, "worker", "w1", steps=STEPS, **keep)
        spawned.append(worker)
        master = disturb(tmp_path, repo, master, worker, spawned)
        assert worker.wait(timeout=TIMEOUT_S) == 0, log_of(tmp_path, "w1")
        # the run is over once the worker's last delta is in: the master ends by itself
        assert master.wait(timeout=TIMEOUT_S) == 0, log_of(tmp_path, "m")
    finally:  # a failed check leaves no process behind, paused ones included
        for process in spawned:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(timeout=TIMEOUT_S)
    assert settled(repo), log_of(tmp_path, "m")
    counted = json.loads((repo / STEP_COUNT).read_text())["nodes"]["w1"]
    assert counted["final"] and counted["end_step"] == STEPS, counted
    assert "holds every node's last delta" in log_of(tmp_path, "m"), log_of(tmp_path, "m")
    assert "Traceback" not in log_of(tmp_path, "m") + log_of(tmp_path, "w1")
    return global_loss(decode_weights((repo / GLOBAL_WEIGHTS).read_bytes(), _reference())[1])


def start_master(tmp_path: Path, repo: Path):
    return start(
        tmp_path, repo, "master", "m", steps=1, train_locally=False, min_deltas=1, max_wait_s=0.0
    )


def settled(repo: Path) -> bool:
    """Every delta consumed, and the published weights are the step count's."""
    return not list(repo.glob("nodes/*/delta_*")) and step_of(repo) == weights_step(repo)


def step_of(repo: Path) -> int | None:
    try:
        return json.loads((repo / STEP_COUNT).read_text())["outer_step"]
    except (OSError, ValueError, KeyError):
        return None


def weights_step(repo: Path) -> int | None:
    try:
        return decode_weights((repo / GLOBAL_WEIGHTS).read_bytes(), _reference())[0]
    except Exception:
        return None


def published_steps(tmp_path: Path) -> list[int]:
    """Every outer step the master logged a round for, across its restarts, in order."""
    text = "".join(p.read_text() for p in sorted(tmp_path.glob("m*.log")))
    return [int(n) for n in re.findall(r"diloco round: outer step (\d+)", text)]


def undisturbed(tmp_path, repo, master, worker, spawned):
    return master


def chaos(tmp_path, repo, master, worker, spawned):
    """Delete global/, tamper step_count, kill -9 and restart, then pause for the rest. The
    worker is held (SIGSTOP) from the kill until the restarted master is paused, so the rest
    of its deltas pile up in the pause: before, a fast worker could finish during the restart
    and leave fewer than the 10 the check wants (seen once in CI-like conditions: 22 went to
    the restarted master's first round)."""
    assert wait_until(lambda: (step_of(repo) or 0) >= 3, TIMEOUT_S), log_of(tmp_path, "m")
    shutil.rmtree(repo / "global")
    assert wait_until(lambda: "missing from the repo; publishing" in log_of(tmp_path, "m"))
    assert wait_until(lambda: (step_of(repo) or 0) >= 6, TIMEOUT_S)
    (repo / STEP_COUNT).write_text(json.dumps({"outer_step": 1_000_000}))
    assert wait_until(lambda: "names no master" in log_of(tmp_path, "m"), TIMEOUT_S)
    assert wait_until(lambda: (step_of(repo) or 0) < 1_000_000, TIMEOUT_S)
    before = step_of(repo)
    worker.send_signal(signal.SIGSTOP)
    master.kill()
    master.wait(timeout=TIMEOUT_S)
    (tmp_path / "m.log").rename(tmp_path / "m-0-killed.log")
    master = start_master(tmp_path, repo)
    spawned.append(master)
    restarted = r"diloco master: outer step (\d+)"
    assert wait_until(lambda: re.search(restarted, log_of(tmp_path, "m")), TIMEOUT_S)
    assert int(re.search(restarted, log_of(tmp_path, "m")).group(1)) >= before
    master.send_signal(signal.SIGSTOP)  # paused for the rest of the worker's run
    worker.send_signal(signal.SIGCONT)
    worker.wait(timeout=TIMEOUT_S)
    assert len(list(repo.glob("nodes/*/delta_*"))) >= 10  # deltas piled up meanwhile
    master.send_signal(signal.SIGCONT)
    return master


@pytest.mark.slow
def test_chaos_loses_no_work_names_every_anomaly_and_never_goes_back(tmp_path):
    reference = run(tmp_path / "calm", undisturbed)
    disturbed = run(tmp_path / "chaos", chaos)
    steps = published_steps(tmp_path / "chaos")
    assert steps == sorted(steps) and steps, steps  # never back, across the restart too
    # Within noise of the undisturbed run (seed-to-seed spread here is ~0.02), where averaging
    # the paused master's deltas gave 4.10 against 1.81
    assert abs(disturbed - reference) < 0.1, (disturbed, reference)
    print(f"final global loss: undisturbed {reference:.4f}, chaos {disturbed:.4f}")
    assert disturbed < global_loss(_reference()) - 1.0  # and it learnt
    assert CONFIG["distributed"]["delta_dtype"] == "fp32"

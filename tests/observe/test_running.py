"""A live run is never overwritten (issue 53, item 1): ``observe/running.py``.

While a run trains, its output directory holds ``.running`` naming its process. A second
``train`` there, fresh, ``--overwrite`` or ``--resume``, used to delete the live run's
checkpoints and metrics (``--overwrite``) or run "nothing to do" (``--resume``), and in both
cases removed the live run's marker, so ``runs`` called it completed. Now each is refused in one
line naming the live process's pid and host, before anything in the directory changes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from speedtronic import liveness
from speedtronic.errors import OutputError
from speedtronic.observe.running import RUNNING_FILE, claim, release
from tests.train.test_start_checks import snapshot, train

runner = CliRunner()
HOST = socket.gethostname()


@pytest.fixture
def live(tmp_path):
    """A live process that holds the run directory's marker, as a training run does."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


@pytest.mark.parametrize("flags", [("--overwrite",), ("--resume",), ()])
def test_a_live_runs_directory_is_refused_and_nothing_changes(tiny, tmp_path, live, flags):
    tiny["logging"]["json_file"] = "metrics.jsonl"
    tiny["checkpoint"] = {"interval": 2}
    assert train(tiny, tmp_path, "--max-steps", "4").exit_code == 0
    run = tmp_path / "run"
    start = liveness.process_start(live.pid)
    (run / RUNNING_FILE).write_text(f"{live.pid} {HOST} {start or ''}\n")
    before = snapshot(run)
    assert "metrics.jsonl" in before and "checkpoints/latest.json" in before
    result = train(tiny, tmp_path, "--max-steps", "2" if flags else "8", *flags)
    assert result.exit_code == 1, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"speedtronic: error: run.output_dir: {run} is in use by a live run")
    assert f"pid {live.pid} on {HOST}" in line and "nothing was changed" in line
    assert snapshot(run) == before  # checkpoints, metrics and the live run's marker all stay


def test_a_dead_runs_marker_does_not_hold_the_directory(tiny, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / RUNNING_FILE).write_text(f"{gone.pid} {HOST}\n")  # a kill -9 left it
    result = train(tiny, tmp_path, "--max-steps", "2")
    assert result.exit_code == 0, result.output
    assert not (run / RUNNING_FILE).exists()  # replaced by the new run's, removed at its end


def test_a_claim_is_refused_while_held_and_released_only_by_its_owner(tmp_path, live):
    held = claim(tmp_path / "runs" / "out")
    assert held.path.read_text() == liveness.stamp()
    release(held)
    assert not (tmp_path / "runs").exists()  # the folders it made, left empty, go too
    mine = claim(tmp_path / "out")
    (tmp_path / "out" / "metrics.jsonl").write_text("{}\n")
    release(mine)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["metrics.jsonl"]
    start = liveness.process_start(live.pid)
    theirs = f"{live.pid} {HOST} {start or ''}\n"
    mine.path.write_text(theirs)
    with pytest.raises(OutputError, match=f"in use by a live run \\(pid {live.pid} on {HOST}"):
        claim(tmp_path / "out")
    release(mine)  # not ours any more: it stays
    assert mine.path.read_text() == theirs
    assert sorted(p.name for p in mine.path.parent.iterdir()) == [RUNNING_FILE, "metrics.jsonl"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert claim(blocked / "out") is None  # a file where the directory should be: no marker


def coordinating(tiny, tmp_path, monkeypatch, coordinate):
    """``train`` of a master that only coordinates, with ``coordinate`` as its work."""
    from speedtronic.distributed import setup

    monkeypatch.setattr(setup, "coordinate_only", coordinate)
    tiny["distributed"] = {"train_locally": False, "outer_steps": 3}
    return train(tiny, tmp_path, "--role", "master", "--repo", str(tmp_path / "repo"))


def test_a_coordinating_master_is_a_run_seen_while_alive_and_summed_up(tiny, tmp_path, monkeypatch):
    """Issue 53, item 6: it had no .running and no summary.json, so ``runs`` called it
    interrupted after 2 quiet minutes, and never completed."""
    from speedtronic.results.listing import list_runs

    run = tmp_path / "run"
    seen = []

    def coordinate(config, model, logger, adapters=None):
        (run / "diloco_master").mkdir()  # its state, as the real master keeps it
        seen.append((run / RUNNING_FILE).read_text())
        seen.append([row["status"] for row in list_runs([tmp_path])])
        return {"outer_step": 3, "final_global": None, "elapsed_s": 0.5, "signal": None}

    result = coordinating(tiny, tmp_path, monkeypatch, coordinate)
    assert result.exit_code == 0, result.output
    assert seen == [liveness.stamp(), ["running"]]
    assert not (run / RUNNING_FILE).exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["stop_reason"] == "outer_steps"
    assert (summary["role"], summary["outer_step"], summary["steps"]) == ("master", 3, 0)
    assert summary["params"] > 0 and summary["config"]["distributed"]["train_locally"] is False
    [row] = list_runs([tmp_path])
    assert (row["status"], row["role"], row["outer_step"]) == ("completed", "master", 3)
    assert "summary: status completed" in result.stdout  # the block every run ends with


def test_a_coordinating_master_that_fails_says_so_and_one_held_is_refused(
    tiny, tmp_path, monkeypatch, live
):
    from speedtronic.errors import TransportError

    def coordinate(config, model, logger, adapters=None):
        raise TransportError("repo: gone")

    result = coordinating(tiny, tmp_path, monkeypatch, coordinate)
    assert result.exit_code == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["error"]) == ("failed", "repo: gone")
    assert not (tmp_path / "run" / RUNNING_FILE).exists()
    (tmp_path / "run" / RUNNING_FILE).write_text(f"{live.pid} {HOST}\n")
    before = snapshot(tmp_path / "run")
    result = coordinating(tiny, tmp_path, monkeypatch, coordinate)
    assert result.exit_code == 1 and f"in use by a live run (pid {live.pid}" in result.stderr
    assert snapshot(tmp_path / "run") == before

"""A live run is never overwritten (issue 53, item 1): ``observe/running.py``.

While a run trains, its output directory holds ``.running`` naming its process. A second
``train`` there, fresh, ``--overwrite`` or ``--resume``, used to delete the live run's
checkpoints and metrics (``--overwrite``) or run "nothing to do" (``--resume``), and in both
cases removed the live run's marker, so ``runs`` called it completed. Now each is refused in one
line naming the live process's pid and host, before anything in the directory changes.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from speedtronic import liveness
from speedtronic.cli.app import app
from speedtronic.observe.running import RUNNING_FILE, claim, release

runner = CliRunner()
HOST = socket.gethostname()


def train(tiny, tmp_path, *args: str):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    return runner.invoke(app, ["train", "-c", str(config), *args])


def snapshot(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


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
    path = claim(tmp_path / "out")
    assert path.read_text() == liveness.stamp()
    release(path)
    assert not path.exists()
    start = liveness.process_start(live.pid)
    theirs = f"{live.pid} {HOST} {start or ''}\n"
    path.write_text(theirs)
    with pytest.raises(Exception, match=f"in use by a live run \\(pid {live.pid} on {HOST}"):
        claim(tmp_path / "out")
    release(path)  # not ours: it stays
    assert path.read_text() == theirs
    assert not [p.name for p in path.parent.iterdir() if p.name != RUNNING_FILE]
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert claim(blocked / "out") is None  # a file where the directory should be: no marker

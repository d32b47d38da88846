"""A run marks itself while it trains, so ``runs`` tells a live run from one killed with -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from speedtronic.observe.running import RUNNING_FILE, claim, release
from speedtronic.results.listing import read_run


def test_a_finished_run_leaves_no_marker(tiny, tmp_path):
    from speedtronic.runtime import train_from_config

    train_from_config(tiny, console=False)
    run = tmp_path / "run"
    assert not (run / RUNNING_FILE).exists()
    assert read_run(run, "run")["row"]["status"] == "completed"


def test_a_marker_says_running_while_its_process_lives_and_interrupted_after(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / RUNNING_FILE).write_text(f"{child.pid} {socket.gethostname()}\n")
        assert read_run(tmp_path, "r")["row"]["status"] == "running"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert read_run(tmp_path, "r")["row"]["status"] == "interrupted"
    finally:
        child.kill()


def test_a_killed_resume_is_not_read_from_the_last_parts_summary(tmp_path):
    """A resumed run killed with -9: the summary is its previous part's ("stopped")."""
    (tmp_path / "summary.json").write_text('{"schema_version": 1, "status": "stopped"}')
    (tmp_path / RUNNING_FILE).write_text(f"999999999 {socket.gethostname()}\n")
    assert read_run(tmp_path, "r")["row"]["status"] == "interrupted"


def test_marking_never_fails_and_clears(tmp_path):
    held = claim(tmp_path / "out")
    assert held.path.read_text().split()[0] == str(os.getpid())
    release(held)
    assert not held.path.exists()
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert claim(blocked / "out") is None  # a file where the directory should be


def test_an_empty_marker_an_hour_old_is_not_running(tmp_path):
    """A kill while the marker was written left it empty: not "running" forever (issue 53)."""
    (tmp_path / "checkpoints").mkdir()
    marker = tmp_path / RUNNING_FILE
    marker.write_text("")
    hour_ago = time.time() - 3600
    os.utime(marker, (hour_ago, hour_ago))
    assert read_run(tmp_path, "r")["row"]["status"] == "interrupted"

"""A run marks itself while it trains, so ``runs`` tells a live run from one killed with -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from speedtronic.observe.summary import RUNNING_FILE, clear_running, mark_running
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
    path = mark_running(tmp_path / "out")
    assert path.read_text().split()[0] == str(os.getpid())
    clear_running(path)
    assert not path.exists()
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert mark_running(blocked / "out") is None  # a file where the directory should be

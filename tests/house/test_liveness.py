"""One liveness rule for every marker a process leaves (issue 53, item 5): ``speedtronic.liveness``.

A marker names ``pid host [start]``. A pid now held by an unrelated process (its start time
differs), an empty or garbled marker left by a kill while it was written, and an oversize one
all read as not alive; a live writer, another host's marker and a marker being written (fresh)
read as alive. The marker is read with a bound: a 3 GiB one costs nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from speedtronic import liveness

HOST = socket.gethostname()
HOUR_AGO = time.time() - 3600


def aged(path, text: str):
    path.write_text(text)
    os.utime(path, (HOUR_AGO, HOUR_AGO))
    return path


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_a_live_writer_is_alive_and_a_dead_one_is_not(tmp_path, sleeper):
    assert liveness.marker_alive(aged(tmp_path / "own", liveness.stamp()))
    start = liveness.process_start(sleeper.pid)
    mark = aged(tmp_path / "child", f"{sleeper.pid} {HOST} {start or ''}\n")
    assert liveness.marker_alive(mark)
    assert liveness.holder(mark) == f"pid {sleeper.pid} on {HOST}"
    assert not liveness.marker_alive(aged(tmp_path / "dead", f"{dead_pid()} {HOST}\n"))
    assert not liveness.marker_alive(tmp_path / "missing")


def test_a_pid_taken_by_another_process_is_not_the_markers_writer(tmp_path, sleeper):
    start = liveness.process_start(sleeper.pid)
    if start is None:
        pytest.skip("no process start times here: the rule falls back to pid and host")
    # the marker's writer started long before the process that holds its pid now
    mark = aged(tmp_path / ".running", f"{sleeper.pid} {HOST} {int(start) - 1}\n")
    assert not liveness.marker_alive(mark)
    # an older marker without a start time: pid and host are all there is
    assert liveness.marker_alive(aged(tmp_path / "old", f"{sleeper.pid} {HOST}\n"))


@pytest.mark.parametrize(
    "text", ["", "\n", "garbage", f"12x {HOST}", f"0 {HOST}", f"1 {HOST} 2 3", "\0" * 64]
)
def test_an_empty_or_garbled_marker_is_dead_once_old_and_held_while_fresh(tmp_path, text):
    mark = aged(tmp_path / ".running", text)
    assert not liveness.marker_alive(mark)
    assert liveness.holder(mark) == "holder unknown"
    mark.write_text(text)  # just written: its writer may be between creating and filling it
    assert liveness.marker_alive(mark)


def test_another_hosts_marker_is_alive_and_an_oversize_one_is_not(tmp_path):
    assert liveness.marker_alive(aged(tmp_path / "far", f"{dead_pid()} elsewhere.example\n"))
    big = aged(tmp_path / "big", f"{os.getpid()} {HOST}\n" + " " * liveness.MARKER_LIMIT)
    assert not liveness.marker_alive(big)


def test_a_3_gib_marker_is_read_with_a_bound(tmp_path):
    resource = pytest.importorskip("resource")
    mark = tmp_path / ".running"
    with mark.open("wb") as handle:  # sparse: no disk space used
        handle.truncate(3 << 30)
    os.utime(mark, (HOUR_AGO, HOUR_AGO))
    script = textwrap.dedent(f"""
        import resource
        from speedtronic.liveness import marker_alive
        resource.setrlimit(resource.RLIMIT_AS, ({1 << 30}, {1 << 30}))  # far below 3 GiB
        print(marker_alive({str(mark)!r}))
    """)
    assert resource.RLIMIT_AS is not None
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"

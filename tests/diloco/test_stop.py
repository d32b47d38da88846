"""A stop is not an end (issue 36): a signalled node saves first, then waits a short grace.

Real processes, real signals. A worker with no master used to wait for a global holding its
last delta (a minute at least, however many signals came) before it wrote its checkpoint, so a
container's stop (SIGTERM, then SIGKILL 10 s later) left none. Waits are by the processes'
progress (``proc_support``); the only clock is the one the issue names: SIGKILL 10 s after
SIGTERM, as Docker and Kubernetes send it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from proc_support import communicate, quiet_env, wait_for

from speedtronic.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow


def worker_config(tiny, tmp_path: Path, **distributed) -> Path:
    tiny["run"].update(max_steps=100000, output_dir=str(tmp_path / "run"))
    tiny["logging"] = {"every_steps": 1, "json_file": "m.jsonl"}
    tiny["checkpoint"] = {"interval": 0}
    tiny["distributed"] = {
        "enabled": True,
        "role": "worker",
        "node_id": "w1",
        "repo_id": str(tmp_path / "repo"),
        "inner_steps": 2,
        "poll_interval": 0.2,
        "drain_timeout_s": 600.0,  # a normal end would wait this long for a master
        **distributed,
    }
    (tmp_path / "repo").mkdir()
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(tiny))
    return path


def start(config: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "speedtronic", "train", "-c", str(config)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env()
    )


def steps_logged(run: Path) -> list[int]:
    path = run / "m.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in records if r.get("event") == "train_step"]


def latest_step(run: Path) -> int | None:
    latest = run / "checkpoints" / "latest.json"
    if not latest.exists():
        return None
    record = json.loads(latest.read_text())
    return load_checkpoint(run / "checkpoints" / record["path"]).meta["step"]


def test_sigterm_saves_first_then_exits_within_the_grace_and_says_what_is_unsent(tiny, tmp_path):
    """Before: 'no global holds this node's last delta (seq 5) after 60 s', then the save."""
    config = worker_config(tiny, tmp_path, stop_grace_s=1.0)
    proc = start(config)
    wait_for(lambda: len(steps_logged(tmp_path / "run")) >= 3, proc)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = communicate(proc)
    took = time.monotonic() - signalled
    assert proc.returncode == 143, stderr
    assert took < 300, f"{took:.0f} s: waited as a normal end does (drain_timeout_s 600)"
    assert latest_step(tmp_path / "run") == max(steps_logged(tmp_path / "run"))
    line = next(x for x in stderr.splitlines() if "diloco: stopped at step" in x)
    assert "not yet in a global" in line and "for the master" in line, line
    assert "resume with: speedtronic train -c" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "run" / "final_global").exists()  # a stop is not an end


def test_a_second_signal_ends_the_grace_at_once(tiny, tmp_path):
    config = worker_config(tiny, tmp_path, stop_grace_s=3600.0)
    proc = start(config)
    wait_for(lambda: len(steps_logged(tmp_path / "run")) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: latest_step(tmp_path / "run") is not None, proc)  # saved: now the grace
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = communicate(proc)
    assert proc.returncode == 143, stderr
    assert time.monotonic() - signalled < 600, "the second signal did not end the grace"
    assert "diloco: stopped at step" in stderr and "Traceback" not in stderr


def test_sigkill_10_s_after_sigterm_finds_the_checkpoint_of_the_last_completed_step(tiny, tmp_path):
    """A container's stop with the default grace: the checkpoint comes before any waiting."""
    config = worker_config(tiny, tmp_path)
    proc = start(config)
    wait_for(lambda: len(steps_logged(tmp_path / "run")) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.communicate()
    step = latest_step(tmp_path / "run")
    assert step is not None, "no checkpoint 10 s after SIGTERM"
    assert step == max(steps_logged(tmp_path / "run"))


def test_a_signal_during_a_normal_ends_drain_cuts_it_to_the_grace(tiny, tmp_path):
    """The run ended (max_steps) and the worker waits for a global holding its last delta, for
    drain_timeout_s (600 s here, no master): a SIGTERM then leaves it the grace, not the wait."""
    config = worker_config(tiny, tmp_path, stop_grace_s=1.0)
    tiny["run"]["max_steps"] = 4
    config.write_text(yaml.safe_dump(tiny))
    proc = start(config)
    sent = tmp_path / "repo" / "nodes" / "w1"
    wait_for(lambda: len(list(sent.glob("delta_*.safetensors"))) >= 2, proc)  # both went out
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = communicate(proc)
    assert time.monotonic() - signalled < 300, "waited out drain_timeout_s"
    # 0: the loop had ended; 143 if the signal came between the last boundary and its end
    assert proc.returncode in (0, 143), stderr
    assert latest_step(tmp_path / "run") == 4 and "Traceback" not in stderr

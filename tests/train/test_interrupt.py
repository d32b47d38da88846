"""Real processes, real signals: graceful stops, exit codes, and SIGKILL at random moments.

The processes are waited for by their progress, not a clock (``proc_support``): a loaded
machine makes them slow, never wrong.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import proc_support
import pytest
import torch
import yaml
from proc_support import communicate, quiet_env, wait_for

from speedtronic.checkpoint import find_latest, load_checkpoint
from speedtronic.runtime import train_from_config


def write_config(tiny, out: Path, **changes) -> Path:
    tiny["run"]["output_dir"] = str(out)
    for section, values in changes.items():
        tiny.setdefault(section, {}).update(values)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(tiny))
    return path


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "speedtronic", "train", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=quiet_env(),
    )


def logged_steps(path: Path) -> int:
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if '"train_step"' in line]
    return len(lines)


@pytest.mark.parametrize(
    ("signum", "code"),
    [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow), (signal.SIGTERM, 143)],
)
def test_first_signal_finishes_the_step_saves_and_says_how_to_resume(tiny, tmp_path, signum, code):
    out = tmp_path / "run"
    config = write_config(
        tiny, out, run={"max_steps": 100000}, logging={"every_steps": 1, "json_file": "m.jsonl"}
    )
    proc = start(config)
    wait_for(lambda: logged_steps(out / "m.jsonl") >= 3, proc)
    proc.send_signal(signum)
    _, stderr = communicate(proc)
    assert proc.returncode == code, stderr
    assert "resume with: speedtronic train -c" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    checkpoint = load_checkpoint(out / "checkpoints" / latest["path"])
    assert checkpoint.meta["step"] == latest["step"] >= 3
    assert f"interrupted at step {latest['step']}" in stderr


@pytest.mark.slow  # a process, 5 s: the default suite keeps one signal test
def test_second_ctrl_c_aborts_at_once_and_keeps_the_last_good_checkpoint(tiny, tmp_path):
    out = tmp_path / "run"
    config = write_config(tiny, out, run={"max_steps": 100000}, checkpoint={"interval": 1})
    proc = start(config)
    wait_for(lambda: (out / "checkpoints" / "latest.json").exists(), proc)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, stderr = communicate(proc)
    assert proc.returncode == 130, stderr
    path = find_latest(out / "checkpoints", log=pytest.fail)
    assert path is not None and load_checkpoint(path).meta["step"] >= 1


def kill_then_resume(config: Path, after_steps: int, delay: float, checkpoint: dict):
    """Start training, SIGKILL it ``delay`` s after step ``after_steps`` is logged, resume."""
    out = Path(yaml.safe_load(config.read_text())["run"]["output_dir"])
    proc = start(config)
    wait_for(lambda: logged_steps(out / "m.jsonl") >= after_steps or proc.poll() is not None, proc)
    time.sleep(delay)  # lands anywhere in the next step or its checkpoint save
    proc.kill()
    proc.wait()
    events = []
    resumed = train_from_config(
        {**yaml.safe_load(config.read_text()), "checkpoint": {**checkpoint, "resume": True}},
        console=False,
        hooks=[lambda e, p: events.append((e, p.get("message")))],
    )
    return (
        resumed,
        [m for e, m in events if e == "warning"],
        [m for e, m in events if e == "notice"],
    )


@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes_to_identical_weights(tiny, tmp_path):
    """10 trials: kill -9 anywhere (often mid-save), resume, and match an uninterrupted run."""
    changes = dict(
        run={"max_steps": 24},
        checkpoint={"interval": 1, "keep_last": 2},
        logging={"every_steps": 1, "json_file": "m.jsonl"},
    )
    reference = train_from_config(
        yaml.safe_load(write_config(tiny, tmp_path / "reference", **changes).read_text()),
        console=False,
    )
    expected = load_checkpoint(reference.checkpoint).model_state
    rng = random.Random(20261130)
    resumed_from = []
    for trial in range(10):
        config = write_config(tiny, tmp_path / f"trial{trial}", **changes)
        after, delay = rng.randint(1, 18), rng.uniform(0.0, 0.03)
        resumed, warnings, notices = kill_then_resume(config, after, delay, changes["checkpoint"])
        assert not warnings, f"trial {trial}: {warnings}"
        assert resumed.steps == 24
        resumed_from += [n for n in notices if "resumed from" in n or "no checkpoint" in n]
        weights = load_checkpoint(resumed.checkpoint).model_state
        for key, value in expected.items():
            assert torch.equal(weights[key], value), f"trial {trial}: {key} differs"
    during = [n for n in resumed_from if "at step 24" not in n]  # not after training ended
    from_checkpoint = [n for n in during if "resumed from" in n]
    assert len(during) >= 7 and len(from_checkpoint) >= 5, resumed_from


# A wrapper round the JSONL file that raises SIGTERM inside a write, as a signal that arrives
# while the logger holds its lock and writes a line (under load, the likely moment).
SIGNAL_MID_WRITE = """
import json, signal, sys
from speedtronic.observe import metrics
from speedtronic.runtime import train_from_config

real_open = metrics._open_append

class SignalMidWrite:
    def __init__(self, handle):
        self.handle, self.writes = handle, 0

    def write(self, text):
        self.writes += 1
        if self.writes == 3:
            signal.raise_signal(signal.SIGTERM)  # its Python handler runs before we return
        return self.handle.write(text)

    def __getattr__(self, name):
        return getattr(self.handle, name)

def opening(path, *args):
    handle = real_open(path, *args)
    return SignalMidWrite(handle) if str(path).endswith(".jsonl") else handle

metrics._open_append = opening
result = train_from_config(json.loads(sys.argv[1]), console=False)
print(result.status, result.signal)
"""


@pytest.mark.slow  # a process, 4 s: the default suite keeps one signal test
def test_a_signal_during_a_log_write_stops_the_run_instead_of_hanging_it(tiny, tmp_path):
    # The handler used to log its notice itself: inside the logger's lock, on the same thread,
    # it waited for that lock forever (found under load: a SIGTERM'd run hung for an hour).
    out = tmp_path / "run"
    write_config(tiny, out, run={"max_steps": 100000}, logging={"every_steps": 1})
    tiny["logging"]["json_file"] = "m.jsonl"
    command = [sys.executable, "-c", SIGNAL_MID_WRITE, json.dumps(tiny)]
    done = proc_support.run(command, env=quiet_env())  # a hang fails it, after STALL_S
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", str(int(signal.SIGTERM))]
    notices = [json.loads(line).get("message", "") for line in (out / "m.jsonl").open()]
    assert any(n.startswith("received SIGTERM: stopping after step ") for n in notices)

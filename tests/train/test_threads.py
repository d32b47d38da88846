"""Issue 55, item 2: ``run.threads`` / ``train --threads``, and the busy-machine notice.

The notice's rule (bench's CPU share: process CPU time / (wall * threads), data waits left out)
is tested with an injected clock and CPU time: nothing here depends on the machine's speed.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError
from speedtronic.runtime import build_runtime, train_from_config
from speedtronic.train.threads import MEASURE_STEPS, CpuShareNotice


class FakeProcess:
    """A clock, a CPU-time counter and a trainer whose data waits the test sets, per step."""

    def __init__(self, cpu_per_s: float, wait_per_step: float = 0.0, step_s: float = 1.0):
        self.wall = self.cpu = self.wait = 0.0
        self.cpu_per_s, self.wait_per_step, self.step_s = cpu_per_s, wait_per_step, step_s
        self.step_log = self  # the plug-in reads trainer.step_log.waited()

    def waited(self) -> float:
        return self.wait

    def step(self) -> None:
        self.wall += self.step_s
        self.wait += self.wait_per_step
        self.cpu += self.cpu_per_s * (self.step_s - self.wait_per_step)


def notices(process: FakeProcess, threads: int, steps: int = 20) -> list[str]:
    seen: list[str] = []
    notice = CpuShareNotice(seen.append, threads, lambda: process.wall, lambda: process.cpu)
    for _ in range(steps):
        process.step()
        notice.after_optimizer_step(process)
    return seen


def test_a_process_with_a_fifth_of_its_cpu_is_told_once_what_to_do():
    seen = notices(FakeProcess(cpu_per_s=0.4), threads=2)  # 0.4 of 2 cores: 20%
    assert len(seen) == 1
    assert "got 20% of the CPU time its 2 threads asked for" in seen[0]
    assert "--threads 1" in seen[0] and "OMP_NUM_THREADS=1" in seen[0]


def test_a_process_with_its_cores_hears_nothing():
    assert notices(FakeProcess(cpu_per_s=1.9), threads=2) == []


def test_waiting_for_data_is_not_taken_for_a_busy_machine():
    # 0.8 s of each 1 s step waits for data; computing, the process had 95% of its cores
    assert notices(FakeProcess(cpu_per_s=1.9, wait_per_step=0.8), threads=2) == []


def test_one_thread_has_nothing_to_wait_for():
    assert notices(FakeProcess(cpu_per_s=0.1), threads=1) == []


def test_the_first_steps_decide_nothing_yet():
    # the first step is not measured (allocations, the first batch), then MEASURE_STEPS more
    assert notices(FakeProcess(cpu_per_s=0.1), threads=2, steps=MEASURE_STEPS) == []
    assert len(notices(FakeProcess(cpu_per_s=0.1), threads=2, steps=MEASURE_STEPS + 1)) == 1


def test_fast_steps_are_measured_over_enough_wall_time():
    quick = FakeProcess(cpu_per_s=0.1, step_s=0.01)  # 2 s of wall take 200 steps
    assert notices(quick, threads=2, steps=150) == []
    assert len(notices(FakeProcess(cpu_per_s=0.1, step_s=0.01), threads=2, steps=250)) == 1


@pytest.mark.parametrize(
    ("value", "rule"),
    [(-1, "must be >= 0 or null"), (1.5, "must be an integer or null (got 1.5)"),
     ("2", "must be an integer or null (got the string '2')")],
)  # fmt: skip
def test_run_threads_is_validated_in_one_line(tiny, value, rule):
    tiny["run"]["threads"] = value
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict(tiny)
    assert str(caught.value).startswith(f"run.threads: {rule}")


@pytest.fixture
def torch_threads():
    threads = torch.get_num_threads()
    yield threads
    torch.set_num_threads(threads)


def test_run_threads_sets_torchs_threads_and_0_keeps_its_default(tiny, torch_threads):
    tiny["run"].update(threads=1, max_steps=1)
    train_from_config(tiny, console=False)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    tiny["run"]["threads"] = 0
    runtime = build_runtime(tiny, console=False)
    assert torch.get_num_threads() == 2
    assert any(isinstance(p, CpuShareNotice) for p in runtime.trainer.plugins)
    # every plug-in is named: train/parallel picks DDP's plug-ins by name (a nameless one
    # failed every DDP run's start)
    assert all(isinstance(p.name, str) for p in runtime.trainer.plugins)


def test_run_threads_above_the_cores_is_refused_before_torch_crashes_on_it(tiny):
    tiny["run"]["threads"] = 100_000  # torch.set_num_threads(100000) can segfault
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict(tiny)
    rule = f"must be in 0..{os.cpu_count()}, this machine's cores (got 100000)"
    assert str(caught.value) == f"run.threads: {rule}"


def test_train_threads_option_is_run_threads(tiny, tmp_path, torch_threads):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny))
    args = ["validate", "-c", str(path), "--threads", "1", "--format", "json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["config"]["run"]["threads"] == 1
    result = CliRunner().invoke(app, ["train", "-c", str(path), "--threads", "-2"])
    assert result.exit_code == 2 and "--threads" in result.stderr

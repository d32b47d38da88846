"""TensorBoard / W&B hooks with stand-in client modules: what they are asked to do.

These run without the ``logging`` extra; ``test_integrations_real.py`` checks the real files.
"""

from __future__ import annotations

import sys
import types

import pytest

from speedtronic.errors import ConfigError
from speedtronic.observe.integrations import WandbHook
from speedtronic.observe.metrics import MetricLogger
from speedtronic.runtime import train_from_config


class FakeWriter:
    instances: list = []

    def __init__(self, log_dir):
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        FakeWriter.instances.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        self.closed = True


def test_tensorboard_hook_by_name(tiny, monkeypatch):
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    tiny["logging"]["hooks"] = ["tensorboard"]
    train_from_config(tiny, console=False)
    writer = FakeWriter.instances[-1]
    assert writer.log_dir.endswith("run/tensorboard") and writer.closed
    steps = [step for tag, _, step in writer.scalars if tag == "train/loss"]
    assert steps == [1, 2, 4, 6]


def test_wandb_hook_by_name(tiny, monkeypatch):
    logged, inits = [], []

    class Run:
        def define_metric(self, name, step_metric=None):
            logged.append(("metric", name, step_metric))

        def log(self, values):
            logged.append(values)

        def finish(self, exit_code):
            logged.append(("finished", exit_code))

    def init(**kwargs):
        inits.append(kwargs)
        return Run()

    module = types.ModuleType("wandb")
    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    tiny["logging"]["hooks"] = ["wandb"]
    train_from_config(tiny, console=False)
    [kwargs] = inits
    assert kwargs["project"] == "speedtronic" and kwargs["name"] == "tiny"
    assert kwargs["dir"] == tiny["run"]["output_dir"]  # no $WANDB_DIR: next to the run
    assert kwargs["config"]["max_steps"] == 6
    assert ("metric", "train/*", "train/step") in logged
    rows = [row for row in logged if isinstance(row, dict)]
    assert [row["train/step"] for row in rows] == [1, 2, 4, 6] and "train/loss" in rows[0]
    assert logged[-1] == ("finished", 0)


def test_wandb_hook_honours_wandb_dir_and_project(monkeypatch):
    inits = []

    class Run:
        define_metric = staticmethod(lambda *args, **kwargs: None)

    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: inits.append(kwargs) or Run()
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setenv("WANDB_DIR", "/elsewhere")
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    WandbHook().on_event("run_start", {"name": "tiny", "output_dir": "/run"})
    assert (inits[0]["dir"], inits[0]["project"]) == (None, "mine")  # wandb reads WANDB_DIR


def test_missing_package_is_a_config_error_before_training(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    tiny["logging"]["hooks"] = ["wandb"]
    events = []
    with pytest.raises(ConfigError) as caught:
        train_from_config(tiny, console=False, hooks=[lambda e, p: events.append(e)])
    assert str(caught.value) == (
        "logging.hooks: wandb needs the wandb package: pip install 'speedtronic[logging]'"
    )
    assert caught.value.hint is None and events == []  # one line; nothing ran


def test_a_failing_hook_is_reported_and_disabled_never_fatal(monkeypatch):
    module = types.ModuleType("wandb")

    def init(**kwargs):
        raise RuntimeError("api_key not configured")

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    events = []
    logger = MetricLogger(console=False, hooks=[WandbHook(), lambda e, p: events.append((e, p))])
    facts = {"name": "tiny", "model": "m", "params": 1, "device": "cpu", "precision": "fp32"}
    facts.update(max_steps=1, batch_size=1, seq_len=1, accumulation_steps=1, output_dir="/run")
    logger.log("run_start", facts)
    logger.log("checkpoint", {"step": 1, "path": "/run/step-1"})
    warnings = [p["message"] for e, p in events if e == "warning"]
    assert len(warnings) == 1 and events[-1][0] == "checkpoint"  # reported once, then gone
    assert "WandbHook failed and was disabled: RuntimeError: api_key" in warnings[0]


def test_unknown_hook_name_is_rejected():
    from speedtronic.config import SpeedtronicConfig

    with pytest.raises(ConfigError, match="must be tensorboard, wandb or an import path"):
        SpeedtronicConfig.from_dict({"logging": {"hooks": ["tensorbord"]}})

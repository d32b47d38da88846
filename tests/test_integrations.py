"""TensorBoard / W&B hooks, driven by a real run with stand-in client modules."""

from __future__ import annotations

import sys
import types

import pytest

from speedtronic.errors import ConfigError
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
    logged = []

    class Run:
        def log(self, values, step):
            logged.append((step, values))

        def finish(self):
            logged.append("finished")

    module = types.ModuleType("wandb")
    module.init = lambda project, name, config: Run()
    monkeypatch.setitem(sys.modules, "wandb", module)
    tiny["logging"]["hooks"] = ["wandb"]
    train_from_config(tiny, console=False)
    assert logged[-1] == "finished" and logged[0][0] == 1 and "train/loss" in logged[0][1]


def test_missing_package_is_a_clear_error(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    tiny["logging"]["hooks"] = ["wandb"]
    events = []
    result = train_from_config(tiny, console=False, hooks=[lambda e, p: events.append((e, p))])
    warnings = [p["message"] for e, p in events if e == "warning"]
    assert result.status == "completed"  # a broken hook is reported, never fatal
    assert any("needs the 'wandb' package" in w for w in warnings)


def test_unknown_hook_name_is_rejected():
    from speedtronic.config import SpeedtronicConfig

    with pytest.raises(ConfigError, match="must be tensorboard, wandb or an import path"):
        SpeedtronicConfig.from_dict({"logging": {"hooks": ["tensorbord"]}})

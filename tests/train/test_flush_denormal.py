"""Issue 40, item 8: a CPU training loop runs with subnormal floats flushed to zero.

A subnormal costs microseconds of CPU in the tied head's backward; the loop flushes them
(precision.flush_denormal, on by default) and gives the caller's setting back afterwards.
"""

from __future__ import annotations

import pytest
import torch

from speedtronic.config import SpeedtronicConfig
from speedtronic.observe.metrics import MetricLogger
from speedtronic.train.precision import resolve_precision
from speedtronic.train.trainer import Trainer, TrainerOptions
from tests.train.test_trainer import TokenModel, make_batches


def flushing() -> bool:
    return bool((torch.tensor([1e-30]) / 1e10).item() == 0.0)  # 1e-40 is subnormal in fp32


class Spy:
    def __init__(self):
        self.seen = []

    def after_optimizer_step(self, trainer):
        self.seen.append(flushing())


def fit(flush: bool) -> list[bool]:
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals (no SSE3)")
    return train_two_steps(Spy(), flush)


def train_two_steps(spy, flush: bool) -> list:
    """Two fp32 steps of a tiny model with ``spy`` as a plug-in; what it saw."""
    model = TokenModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = resolve_precision("fp32", torch.device("cpu"), print)
    options = TrainerOptions(max_steps=2, flush_denormal=flush, handle_signals=False)
    logger = MetricLogger(console=False)
    Trainer(
        model, optimizer, iter(make_batches(2, 2)), precision, options, None, logger, [spy]
    ).fit()
    return spy.seen


def test_the_loop_flushes_subnormals_and_restores_the_setting_after():
    assert fit(True) == [True, True]
    assert not flushing()


def test_flush_denormal_false_keeps_ieee_subnormals():
    assert fit(False) == [False, False]


def test_a_caller_who_flushes_already_keeps_flushing():
    torch.set_flush_denormal(True)
    try:
        fit_seen = fit_keeping_flag()
        assert fit_seen == [True, True] and flushing()
    finally:
        torch.set_flush_denormal(False)


def fit_keeping_flag() -> list[bool]:
    model, spy = TokenModel(), Spy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = resolve_precision("fp32", torch.device("cpu"), print)
    options = TrainerOptions(max_steps=2, handle_signals=False)
    logger = MetricLogger(console=False)
    Trainer(
        model, optimizer, iter(make_batches(2, 2)), precision, options, None, logger, [spy]
    ).fit()
    return spy.seen


def test_the_key_is_documented_and_on_by_default():
    assert SpeedtronicConfig.from_dict({}).precision.flush_denormal is True
    off = SpeedtronicConfig.from_dict({"precision": {"flush_denormal": False}})
    assert off.precision.flush_denormal is False

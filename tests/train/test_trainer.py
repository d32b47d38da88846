"""Trainer: exact accumulation, precision rules, compile fallback, non-finite handling, stops."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from torch import nn

from speedtronic.config import OptimizerConfig, SchedulerConfig, SpeedtronicConfig
from speedtronic.errors import ConfigError, TrainingError
from speedtronic.observe.metrics import MetricLogger
from speedtronic.optim.build import build_optimizer, lr_factor, param_groups
from speedtronic.runtime import build_runtime, train_from_config
from speedtronic.train.precision import resolve_device, resolve_precision
from speedtronic.train.trainer import Trainer, TrainerOptions, loss_weights


class TokenModel(nn.Module):
    """Mean token cross-entropy, like most LMs."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, vocab)

    def forward(self, input_ids, labels):
        logits = self.out(self.emb(input_ids))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def make_batches(n: int, rows: int, seed: int = 0, pad: bool = True):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(n):
        ids = torch.randint(0, 11, (rows, 6), generator=g)
        labels = torch.randint(0, 11, (rows, 6), generator=g)
        if pad:  # uneven padding: micro-batches hold different numbers of real tokens
            labels[:, 6 - (i % 3) * 2 :] = -100
        batches.append({"input_ids": ids, "labels": labels})
    return batches


def cat(batches):
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def grads_after_step(batches, accumulation: int):
    model = TokenModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    precision = resolve_precision("fp32", torch.device("cpu"), print)
    options = TrainerOptions(max_steps=1, accumulation_steps=accumulation, grad_clip=None)
    trainer = Trainer(
        model, optimizer, iter(batches), precision, options, logger=MetricLogger(console=False)
    )
    captured = {}
    hook = optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: captured.update(
            {n: p.grad.clone() for n, p in model.named_parameters()}
        )
    )
    loss, _ = trainer.train_step()
    hook.remove()
    return loss, captured


@pytest.mark.parametrize("pad", [False, True])
def test_accumulated_gradient_equals_big_batch_gradient(pad):
    micro = make_batches(4, rows=2, pad=pad)
    loss_acc, grads_acc = grads_after_step(micro, accumulation=4)
    loss_big, grads_big = grads_after_step([cat(micro)], accumulation=1)
    torch.testing.assert_close(loss_acc, loss_big)
    for name in grads_big:
        torch.testing.assert_close(grads_acc[name], grads_big[name], rtol=1e-5, atol=1e-7)


def test_loss_weights_count_non_ignored_labels_and_survive_all_padding():
    micro = [{"labels": torch.tensor([[1, -100]])}, {"labels": torch.tensor([[1, 2]])}]
    assert [float(w) for w in loss_weights(micro)] == pytest.approx([1 / 3, 2 / 3])
    empty = [{"labels": torch.full((1, 2), -100)}] * 2
    assert [float(w) for w in loss_weights(empty)] == [0.0, 0.0]


def test_weight_decay_only_on_matrices():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.1)
    assert [p.dim() for p in decay["params"]] == [2]
    assert sorted(p.dim() for p in no_decay["params"]) == [1, 1, 1]
    assert no_decay["weight_decay"] == 0.0


def test_fused_adamw_where_it_constructs_else_foreach():
    model = nn.Linear(4, 4)
    _, kernel = build_optimizer(model, OptimizerConfig(), print)
    try:
        torch.optim.AdamW(nn.Linear(2, 2).parameters(), fused=True)
        expected = "fused"
    except (RuntimeError, TypeError, ValueError):
        expected = "foreach"
    assert kernel == expected
    _, kernel = build_optimizer(model, OptimizerConfig(fused=False), print)
    assert kernel == "foreach"


def test_cosine_schedule_with_warmup_and_floor():
    factor = lr_factor(SchedulerConfig(warmup_steps=10, min_lr_ratio=0.1), horizon=110)
    assert factor(0) == pytest.approx(0.1)
    assert factor(9) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.55)
    assert factor(110) == pytest.approx(0.1)
    assert factor(500) == pytest.approx(0.1)
    constant = lr_factor(SchedulerConfig(name="constant", warmup_steps=0), horizon=10)
    assert constant(7) == 1.0


def test_precision_rules_on_cpu():
    warnings = []
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu, warnings.append).mode == "fp32"
    assert resolve_precision("bf16", cpu, warnings.append).dtype == torch.bfloat16
    assert not warnings
    assert resolve_precision("fp16", cpu, warnings.append).mode == "fp32"
    assert "fp16" in warnings[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_a_config_error():
    with pytest.raises(ConfigError, match="run.device: 'cuda' is not available"):
        resolve_device("cuda")


def test_training_learns_and_is_deterministic(tiny, tmp_path):
    tiny["run"]["max_steps"] = 30
    first = train_from_config(tiny, console=False)
    tiny["run"]["output_dir"] = str(tmp_path / "again")  # one run per directory
    second = train_from_config(SpeedtronicConfig.from_dict(tiny), console=False)
    assert first.steps == 30 and first.status == "completed"
    assert first.final_loss == second.final_loss
    assert first.final_loss < 0.7 * torch.log(torch.tensor(64.0)).item()
    assert first.tokens == 30 * 8 * 16 and first.samples == 30 * 8


def test_bf16_autocast_on_cpu_trains(tiny):
    tiny["precision"] = {"mode": "bf16"}
    result = train_from_config(tiny, console=False)
    assert result.final_loss is not None and result.final_loss < 5


def test_metrics_reach_jsonl_and_hooks(tiny):
    tiny["logging"]["json_file"] = "metrics.jsonl"
    events = []
    train_from_config(tiny, console=False, hooks=[lambda e, p: events.append((e, p))])
    steps = [p for e, p in events if e == "train_step"]
    assert [p["step"] for p in steps] == [1, 2, 4, 6]
    for key in (
        "loss",
        "lr",
        "steps_per_s",
        "samples_per_s",
        "tokens_per_s",
        "grad_norm",
        "data_wait_share",
        "mfu",
        "memory_gb",
    ):
        assert key in steps[-1]
    lines = (tmp := tiny["run"]["output_dir"]) and open(f"{tmp}/metrics.jsonl").readlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records if r["event"] == "train_step"] == [1, 2, 4, 6]
    assert records[0]["event"] == "run_start" and records[-1]["event"] == "run_end"


def test_failing_hook_is_reported_not_fatal(tiny):
    class Broken:
        def on_event(self, event, payload):
            raise RuntimeError("boom")

    events = []
    result = train_from_config(
        tiny, console=False, hooks=[Broken(), lambda e, p: events.append((e, p))]
    )
    assert result.status == "completed"
    warnings = [p["message"] for e, p in events if e == "warning"]
    assert any("Broken failed" in w and "boom" in w for w in warnings)


class NaNAt(nn.Module):
    """Returns a NaN loss on chosen calls; otherwise a simple regression loss."""

    def __init__(self, bad_calls):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.bad, self.calls = set(bad_calls), 0

    def forward(self, x):
        self.calls += 1
        loss = (self.w * x).sum() ** 2
        return loss * float("nan") if self.calls in self.bad else loss


def run_nan(bad_calls, steps):
    model = NaNAt(bad_calls)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    precision = resolve_precision("fp32", torch.device("cpu"), print)
    logger = MetricLogger(console=False)
    warnings = []
    logger.add_hook(lambda e, p: e == "warning" and warnings.append(p["message"]))
    data = iter([torch.ones(1, 3)] * 100)
    trainer = Trainer(
        model,
        optimizer,
        data,
        precision,
        TrainerOptions(max_steps=steps, max_nonfinite=3),
        logger=logger,
    )
    return trainer, model, warnings


def test_non_finite_loss_skips_the_update_and_reports():
    trainer, model, warnings = run_nan({2}, steps=1)
    trainer.fit()
    before = model.w.detach().clone()
    trainer.options.max_steps = 2
    result = trainer.fit()
    assert torch.equal(model.w.detach(), before)  # the NaN step changed nothing
    assert result.skipped_steps == 1 and "non-finite" in warnings[0]
    assert torch.isfinite(model.w).all()


def test_repeated_non_finite_losses_stop_with_a_clear_error():
    trainer, _, _ = run_nan({2, 3, 4}, steps=10)
    with pytest.raises(TrainingError, match="3 non-finite steps in a row"):
        trainer.fit()


def test_compile_failure_on_first_step_falls_back_to_eager(tiny, tmp_path, monkeypatch):
    def broken_compile(model, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("inductor exploded")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    eager = train_from_config(tiny, console=False)
    tiny["compile"] = True
    tiny["run"]["output_dir"] = str(tmp_path / "compiled")  # one run per directory
    events = []
    compiled = train_from_config(tiny, console=False, hooks=[lambda e, p: events.append((e, p))])
    assert compiled.final_loss == eager.final_loss
    assert any("inductor exploded" in p["message"] for e, p in events if e == "warning")


def test_compile_construction_failure_warns(tiny, monkeypatch):
    def unavailable(model, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", unavailable)
    tiny["compile"] = True
    events = []
    result = train_from_config(tiny, console=False, hooks=[lambda e, p: events.append((e, p))])
    assert result.status == "completed"
    assert any("no compiler" in p["message"] for e, p in events if e == "warning")


class TupleModel(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x, y):
        loss = ((self.lin(x).squeeze(-1) - y) ** 2).mean()
        return loss, "extra"


class TupleData(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((4,), float(i % 7))
        return x, x.sum() * 0.1


def test_custom_model_tuple_batches_and_tuple_output(tiny):
    tiny["gradient_checkpointing"] = True  # TupleModel lacks it: warning, not a crash
    events = []
    result = train_from_config(
        tiny,
        model=TupleModel(),
        dataset=TupleData(),
        console=False,
        hooks=[lambda e, p: events.append((e, p))],
    )
    assert result.status == "completed" and result.samples == 6 * 8
    assert any("set_gradient_checkpointing" in p["message"] for e, p in events if e == "warning")


def test_dict_output_is_accepted(tiny):
    class DictModel(TupleModel):
        def forward(self, x, y):
            return {"loss": super().forward(x, y)[0]}

    result = train_from_config(tiny, model=DictModel(), dataset=TupleData(), console=False)
    assert result.final_loss is not None


def test_sigterm_stops_after_the_current_step(tiny):
    tiny["run"]["max_steps"] = 50
    runtime = build_runtime(tiny, console=False)

    class KillAtStep3:
        name = "kill"

        def after_optimizer_step(self, trainer):
            if trainer.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    runtime.trainer.plugins.append(KillAtStep3())
    previous = signal.getsignal(signal.SIGTERM)
    result = runtime.trainer.fit()
    assert result.status == "interrupted" and result.signal == signal.SIGTERM
    assert result.steps in (3, 4)
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored

"""Hardening of the Trainer: a step with no tokens to learn from stops the run.

An empty micro-batch (no elements) is refused from its shapes on the host; a step whose
labels are all ignored is refused from the count read back with the loss, in the same single
device read per optimizer step. Neither may touch the weights or write a checkpoint.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from speedtronic.errors import TrainingError
from speedtronic.observe.metrics import MetricLogger
from speedtronic.runtime import build_runtime
from speedtronic.train.precision import resolve_precision
from speedtronic.train.trainer import (
    IGNORE_INDEX,
    Trainer,
    TrainerOptions,
    label_counts,
    loss_weights,
)


class TokenModel(nn.Module):
    """Sum / clamp(count, 1) like the reference model: an all-ignored batch reads 0.0."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, vocab)

    def forward(self, input_ids, labels):
        logits = self.out(self.emb(input_ids)).flatten(0, 1)
        total = nn.functional.cross_entropy(logits, labels.flatten(), reduction="sum")
        return total / (labels != IGNORE_INDEX).sum().clamp(min=1)


def batch(rows: int = 2, cols: int = 6, ignored: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 100 + cols)
    labels = torch.randint(0, 11, (rows, cols), generator=g)
    if ignored:
        labels[:] = IGNORE_INDEX
    return {"input_ids": torch.randint(0, 11, (rows, cols), generator=g), "labels": labels}


def trainer_on(batches, accumulation: int = 1, device: str = "cpu") -> Trainer:
    model = TokenModel().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    precision = resolve_precision("fp32", torch.device(device), print)
    options = TrainerOptions(
        max_steps=len(batches) // accumulation, accumulation_steps=accumulation
    )
    return Trainer(
        model, optimizer, iter(batches), precision, options, logger=MetricLogger(console=False)
    )


def weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_all_ignored_step_is_refused_before_the_update(accumulation):
    good = [batch() for _ in range(accumulation)]
    bad = [batch(ignored=True) for _ in range(accumulation)]
    trainer = trainer_on(good + bad, accumulation)
    trainer.train_step()
    before = weights(trainer)
    with pytest.raises(TrainingError, match=r"^step 2: every label is -100 \(ignored\)"):
        trainer.train_step()
    # AdamW with weight decay would move every weight even on a zero gradient.
    assert all(torch.equal(a, b) for a, b in zip(before, weights(trainer), strict=True))
    assert trainer.step == 1


def test_one_all_ignored_micro_batch_among_real_ones_still_trains():
    trainer = trainer_on([batch(ignored=True), batch()], accumulation=2)
    before = weights(trainer)
    loss, _ = trainer.train_step()
    assert float(loss) > 0 and trainer.step == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, weights(trainer), strict=True))


@pytest.mark.parametrize("rows, cols", [(0, 6), (2, 0)])
def test_empty_micro_batch_is_refused_from_its_shape(rows, cols):
    trainer = trainer_on([batch(rows, cols)])
    with pytest.raises(TrainingError, match=r"^step 1: the data yielded an empty micro-batch"):
        trainer.train_step()
    assert trainer.step == 0


def test_fit_on_all_ignored_data_fails_without_an_end_of_run_checkpoint(tiny):
    class AllIgnored(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.arange(16) % 64
            return {"input_ids": ids, "labels": torch.full((16,), IGNORE_INDEX)}

    runtime = build_runtime(tiny, dataset=AllIgnored(), console=False)
    with pytest.raises(TrainingError, match="step 1: every label"):
        runtime.trainer.fit()
    assert runtime.checkpoints.last_path is None
    assert not runtime.config.checkpoint_dir.exists() or not any(
        runtime.config.checkpoint_dir.iterdir()
    )


def test_label_counts_feed_loss_weights():
    micro = [{"labels": torch.tensor([[1, -100]])}, {"labels": torch.tensor([[1, 2]])}]
    counts = label_counts(micro)
    assert [int(c) for c in counts] == [1, 2]
    assert [float(w) for w in loss_weights(micro, counts)] == pytest.approx([1 / 3, 2 / 3])
    assert label_counts([{"labels": torch.zeros(2, 2)}]) is None  # float targets: not counted


@pytest.mark.gpu
def test_a_cuda_step_reads_the_device_once():
    """The refusal rides on the per-step finiteness read: no extra synchronisation."""
    device = "cuda"
    batches = [{k: v.to(device) for k, v in batch().items()} for _ in range(6)]
    trainer = trainer_on(batches, accumulation=2, device=device)
    trainer.train_step()  # the first step may synchronise while kernels and state initialise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]


def test_emulated_precision_is_warned_once_at_start(tiny, monkeypatch):
    import speedtronic.runtime as runtime_module

    probed = []

    def emulated(device, mode):
        probed.append((device.type, mode))
        return f"precision.mode: {mode} is emulated on this CPU"

    monkeypatch.setattr(runtime_module, "emulation_warning", emulated)
    tiny["precision"] = {"mode": "bf16"}
    seen = []
    runtime = build_runtime(
        tiny, console=False, hooks=[lambda e, p: e == "warning" and seen.append(p["message"])]
    )
    runtime.trainer.fit()
    assert probed == [("cpu", "bf16")]  # the resolved mode, probed once per run
    assert seen.count("precision.mode: bf16 is emulated on this CPU") == 1


class MeanModel(TokenModel):
    """Mean-reduced cross-entropy, as Hugging Face models compute it: NaN when all ignored."""

    def forward(self, input_ids, labels):
        logits = self.out(self.emb(input_ids)).flatten(0, 1)
        return nn.functional.cross_entropy(logits, labels.flatten())


def test_a_mean_loss_model_with_one_all_ignored_micro_batch_reports_a_finite_loss():
    trainer = trainer_on([batch(ignored=True), batch()], accumulation=2)
    trainer.model = trainer._forward = MeanModel()
    trainer.params = list(trainer.model.parameters())
    trainer.optimizer = torch.optim.AdamW(trainer.params, lr=0.1)
    loss, _ = trainer.train_step()
    assert torch.isfinite(loss) and float(loss) > 0 and trainer.step == 1

"""Clipping in one pass (issue 40): with fused AdamW the clip's scale rides on the step's
``grad_scale`` instead of a second pass over the gradients; the weights are clip-then-step's,
the reported norm is the pre-clip norm, and optimizers that cannot take the scale fall back."""

from __future__ import annotations

import pytest
import torch

from speedtronic.config import SpeedtronicConfig
from speedtronic.observe.metrics import MetricLogger
from speedtronic.optim.build import build_optimizer
from speedtronic.registry import build_model
from speedtronic.train.clip import GradClip, scale_taker, takes_grad_scale
from speedtronic.train.precision import resolve_precision
from speedtronic.train.trainer import Trainer, TrainerOptions

STEPS = 4
OPTIMIZERS = [{"name": "adamw"}, {"name": "adamw", "fused": False}, {"name": "muon"}]
MODEL = {"vocab_size": 64, "seq_len": 8, "n_layer": 1, "n_head": 2, "d_model": 32}


def setup(optimizer: dict):
    """fp32 Newton-Schulz for Muon: bf16's rounding would amplify the fold's last-bit
    differences in the AdamW part's weights into Muon's update."""
    if optimizer.get("name") == "muon":
        optimizer = {"muon_precision": "fp32", **optimizer}
    torch.manual_seed(0)
    model = build_model("reference_transformer", MODEL)
    config = SpeedtronicConfig.from_dict({"optimizer": {"lr": 1e-2, **optimizer}}).optimizer
    built, kernel = build_optimizer(model, config, print)
    return model, built, kernel


def batches(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 64, (4, 8), generator=g) for _ in range(STEPS)]
    return [{"input_ids": i, "labels": torch.roll(i, -1, 1)} for i in ids]


def trainer_run(optimizer: dict, clip: float | None, fold: bool = True):
    """``fold=False``: the two-pass path (torch's norm pass, then its scale pass, then the step),
    what the Trainer ran before."""
    model, opt, kernel = setup(optimizer)
    precision = resolve_precision("fp32", torch.device("cpu"), print)
    options = TrainerOptions(max_steps=STEPS, grad_clip=clip, log_every=1, handle_signals=False)
    logger = MetricLogger(console=False)
    trainer = Trainer(model, opt, iter(batches()), precision, options, logger=logger)
    trainer.clip.fold &= fold
    norms = [trainer.train_step()[1] for _ in range(STEPS)]
    return model, norms, trainer, kernel


def two_pass(optimizer: dict, clip: float | None):
    model, norms, _, _ = trainer_run(optimizer, clip, fold=False)
    return model, norms


def assert_close_weights(a, b):
    """Each tensor within 1e-6 of the reference, relative to its norm: an element near zero
    carries the float rounding of a step that moved it by ~lr."""
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        error = torch.linalg.vector_norm(x - y) / torch.linalg.vector_norm(y)
        assert error <= 1e-6, f"{name}: {float(error):.3g} relative"


def fused_or_skip(kernel: str) -> None:
    if kernel != "fused":
        pytest.skip("no fused AdamW kernel on this torch build")


@pytest.mark.parametrize("clip", [0.05, 1e6, None], ids=["active", "inactive", "off"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["fused", "foreach", "muon"])
def test_weights_and_norms_equal_clip_then_step(optimizer, clip):
    """After N steps the weights are the two-pass path's (1e-6 relative), the norms pre-clip;
    a foreach AdamW keeps the scale pass, Muon's matrices too (its AdamW part folds)."""
    expected, expected_norms = two_pass(optimizer, clip)
    model, norms, trainer, kernel = trainer_run(optimizer, clip)
    assert_close_weights(model, expected)
    torch.testing.assert_close(torch.stack(norms), torch.stack(expected_norms), rtol=1e-6, atol=0)
    if clip == 0.05:
        assert min(expected_norms) > 0.05  # the clip really acted on every step
    assert trainer.clip.fold is (kernel == "fused" and optimizer.get("fused") is not False)


def test_fused_adamw_never_scales_the_gradients_in_a_pass_of_their_own(monkeypatch):
    """The scale reaches the kernel as grad_scale = 1/coef; no clip_grad_norm_, no scale pass."""
    expected, _ = two_pass({"name": "adamw", "fused": True}, 0.05)

    def refused(*args, **kwargs):
        raise AssertionError("a second pass over the gradients")

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", refused)
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", refused)
    model, _, trainer, kernel = trainer_run({"name": "adamw", "fused": True}, 0.05)
    fused_or_skip(kernel)
    assert_close_weights(model, expected)
    assert not hasattr(trainer.optimizer, "grad_scale")  # handed over for the step only


def test_the_pending_scale_is_for_one_step_only():
    """A skipped step's scale is never applied to a later step's gradients."""
    model, opt, kernel = setup({"name": "adamw", "fused": True})
    fused_or_skip(kernel)
    clip = GradClip(opt, scaler=False, foreach=False)
    model(**batches()[0]).backward()
    clip.clip(list(model.parameters()), 0.05)
    opt.zero_grad(set_to_none=True)  # the step was skipped (e.g. a non-finite loss)
    model(**batches()[1]).backward()
    norm = clip.clip(list(model.parameters()), None)  # clipping now off
    assert clip._scale is None and torch.isfinite(norm)


def test_what_can_take_the_scale():
    """Only a fused Adam/AdamW divides by grad_scale (in MuonAdamW: its AdamW part); a
    GradScaler owns grad_scale when there is one."""
    for optimizer, takes in [
        ({"name": "adamw", "fused": True}, True),
        ({"name": "adamw", "fused": False}, False),
        ({"name": "muon"}, False),
    ]:
        _, opt, kernel = setup(optimizer)
        assert takes_grad_scale(opt) is (takes and kernel == "fused")
        assert GradClip(opt, scaler=True, foreach=False).fold is False
    _, opt, kernel = setup({"name": "muon"})
    assert scale_taker(opt) is (opt.adamw if kernel == "fused" else None)

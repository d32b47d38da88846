"""Muon (issue 30): the update is torch.optim.Muon's, the split goes by module, the hybrid
optimizer acts as one optimizer (schedule, state, checkpoints), and configs say what is wrong."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import CheckpointError, ConfigError
from speedtronic.optim.build import MuonAdamW, build_optimizer, build_scheduler, muon_weight_decay
from speedtronic.optim.muon import Muon, adjusted_lr, newton_schulz, ns_precision, orthogonalise
from speedtronic.optim.param_split import split_parameters
from speedtronic.registry import build_model

SHAPES = [(16, 16), (8, 16), (48, 16), (16, 48), (48, 16)]  # square, wide, tall; two stacks


def matrices(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(*s, generator=g) * 0.1) for s in SHAPES]


def run_steps(optimizer, params, steps=4):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_stacked_bf16_is_torch_muon(adjust, nesterov):
    """Same coefficients, momentum, lr adjustment and decay: within bf16 rounding of torch's."""
    theirs, ours = matrices(), matrices()
    kwargs = dict(lr=0.02, weight_decay=0.05, nesterov=nesterov, adjust_lr_fn=adjust)
    run_steps(torch.optim.Muon(theirs, **kwargs), theirs)
    run_steps(Muon(ours, ns_dtype=torch.bfloat16, **kwargs), ours)
    scale = max(adjusted_lr(0.02, adjust, s) for s in SHAPES)
    for a, b in zip(theirs, ours, strict=True):
        # one bf16 ulp (2**-8 of an entry below 1) per step at most, if the kernels round apart
        torch.testing.assert_close(a, b, rtol=0, atol=4 * scale * 2**-8)


def test_fp32_iteration_matches_float64_and_orthogonalises():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 24, generator=g)
    fp32 = newton_schulz(x, 5)
    fp64 = newton_schulz(x.double(), 5)
    torch.testing.assert_close(fp32.double(), fp64, rtol=0, atol=1e-5)
    singular = torch.linalg.svdvals(fp64)  # the quintic's band around 1 (Jordan: 0.5 to 1.5)
    assert singular.min() > 0.5 and singular.max() < 1.5


def test_tall_matrices_turn_on_their_side_and_keep_their_shape():
    updates = [torch.randn(48, 16), torch.randn(16, 48)]
    out = orthogonalise(updates, 5, torch.float32)
    assert [o.shape for o in out] == [(48, 16), (16, 48)]
    alone = newton_schulz(updates[0].T.unsqueeze(0), 5)[0].T
    torch.testing.assert_close(out[0], alone)  # stacked with the wide one: the same result


def test_state_dicts_load_either_way_with_torch_muon():
    theirs, ours = matrices(), matrices()
    a, b = torch.optim.Muon(theirs, lr=0.02), Muon(ours, lr=0.02, ns_dtype=torch.float32)
    run_steps(a, theirs, 2)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.state[ours[0]]["momentum_buffer"], a.state[theirs[0]]["momentum_buffer"])
    a.load_state_dict(b.state_dict())  # our extra group keys do not bother torch's


def test_momentum_warms_up_from_085_and_counts_steps_in_the_group():
    params = matrices()
    optimizer = Muon(params, momentum=0.95, momentum_warmup_steps=4, ns_dtype=torch.float32)
    seen = []
    original = Muon._momentum

    def spy(group):
        seen.append(original(group))
        return seen[-1]

    optimizer._momentum = spy
    run_steps(optimizer, params, 6)
    assert seen == pytest.approx([0.85, 0.875, 0.9, 0.925, 0.95, 0.95])
    assert optimizer.state_dict()["param_groups"][0]["muon_steps"] == 6  # resumes from here


def test_ns_precision_follows_the_device_and_the_request():
    cpu = torch.device("cpu")
    assert ns_precision(cpu, "fp32") is torch.float32
    assert ns_precision(cpu, "bf16") is torch.bfloat16
    assert ns_precision(cpu) in (torch.bfloat16, torch.float32)  # the probe decides
    assert ns_precision(torch.device("mps")) is torch.float32


# ---- the split ---------------------------------------------------------------------------


def reference(**params):
    base = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32)
    return build_model("reference_transformer", {**base, **params})


def test_the_tied_embedding_is_not_a_hidden_matrix():
    model = reference()
    split = split_parameters(model)
    assert split.source == "hidden_matrices()"
    assert len(split.muon) == 14 and all(n.startswith("blocks.") for n in split.muon_names)
    assert "tok_emb.weight" in split.adamw_names  # also the head: one tensor, on AdamW
    assert all(
        p.ndim == 1 for n, p in zip(split.adamw_names, split.adamw, strict=True) if "norm" in n
    )
    assert {id(p) for p in split.muon}.isdisjoint(id(p) for p in split.adamw)
    assert len(split.muon) + len(split.adamw) == len(list(model.parameters()))


def test_an_untied_head_stays_on_adamw():
    split = split_parameters(reference(tie_embeddings=False))
    assert "lm_head.weight" in split.adamw_names and "lm_head.weight" not in split.muon_names


class Plain(nn.Module):
    """No hook: the split goes by nn.Linear, minus the tied table and a named head."""

    def __init__(self, tied=True):
        super().__init__()
        self.emb = nn.Embedding(32, 32)
        self.proj = nn.Linear(32, 32)  # 32 x 32 like the head: shapes cannot tell them apart
        self.mix = nn.Linear(32, 32, bias=False)
        self.out = nn.Linear(32, 32, bias=False)
        self.lm_head = nn.Linear(32, 32, bias=False)
        if tied:
            self.out.weight = self.emb.weight
        self.scale = nn.Parameter(torch.ones(2, 2, 2))


def test_without_a_hook_linear_weights_are_hidden_but_tied_and_head_ones_are_not():
    split = split_parameters(Plain())
    assert split.source == "nn.Linear"
    assert split.muon_names == ["proj.weight", "mix.weight"]
    assert {"emb.weight", "proj.bias", "lm_head.weight", "scale"} <= set(split.adamw_names)


def test_exclude_patterns_move_matrices_to_adamw_and_a_typo_is_an_error():
    split = split_parameters(reference(), ["blocks.0.*", "*.mlp.w_down.weight"])
    assert all(not n.startswith("blocks.0.") for n in split.muon_names)
    assert "blocks.1.mlp.w_down.weight" in split.adamw_names
    with pytest.raises(ConfigError, match=r"muon_exclude: 'blocks\.9\.\*' matches no parameter"):
        split_parameters(reference(), ["blocks.9.*"])
    with pytest.raises(ConfigError, match="found no hidden 2-D weight matrix"):
        split_parameters(reference(), ["*"])


def test_a_hook_that_yields_a_vector_or_a_stranger_is_refused():
    model = reference()
    model.hidden_matrices = lambda: [model.norm.weight]
    with pytest.raises(ConfigError, match=r"yielded norm\.weight of shape \[32\]; Muon takes 2-D"):
        split_parameters(model)
    model.hidden_matrices = lambda: [nn.Parameter(torch.ones(2, 2))]
    with pytest.raises(ConfigError, match="trainable parameters of the model itself"):
        split_parameters(model)


def test_the_split_works_on_the_meta_device():
    with torch.device("meta"):
        model = reference()
    assert "muon on 14 matrices" in split_parameters(model).summary()


# ---- the hybrid optimizer ----------------------------------------------------------------


def hybrid(model=None, **optimizer):
    config = SpeedtronicConfig.from_dict({"optimizer": {"name": "muon", "lr": 1e-3, **optimizer}})
    model = model or reference()
    optimizer, kernel = build_optimizer(model, config.optimizer, warn=print)
    return model, optimizer, kernel


def step_model(model, optimizer, steps=2):
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        ids = torch.randint(0, 64, (2, 16), generator=g)
        model(ids, ids).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_one_optimizer_holds_both_and_a_schedule_scales_both_lrs():
    model, optimizer, _ = hybrid(muon_lr=0.02)
    assert isinstance(optimizer, MuonAdamW)
    kinds = [g["kind"] for g in optimizer.param_groups]
    assert kinds == ["adamw", "adamw", "muon"]
    schedule_config = SpeedtronicConfig.from_dict({"scheduler": {"warmup_steps": 4}}).scheduler
    scheduler = build_scheduler(optimizer, schedule_config, 100)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([2.5e-4, 2.5e-4, 0.005])
    step_model(model, optimizer, 1)
    scheduler.step()
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(0.01)  # the inner one too
    muon_param = optimizer.split.muon[0]
    assert "momentum_buffer" in optimizer.state[muon_param]
    assert "exp_avg" in optimizer.state[optimizer.split.adamw[0]]
    optimizer.state.clear()  # a DiLoCo reset: both halves
    assert optimizer.muon.state == {} and optimizer.adamw.state == {}


def test_the_state_dict_round_trips_through_weights_only_and_resumes_exactly():
    model, optimizer, _ = hybrid()
    step_model(model, optimizer)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    step_model(model, optimizer)
    straight = {k: v.clone() for k, v in model.state_dict().items()}
    again, restored, _ = hybrid()
    again.load_state_dict(saved["model"])
    restored.load_state_dict(saved["optimizer"])
    step_model(again, restored)
    for key, value in straight.items():
        assert torch.equal(value, again.state_dict()[key]), key
    assert restored.adamw.state is restored.state  # linked again after the load


def test_an_optimizer_state_of_the_other_kind_is_refused_by_name():
    model, muon, _ = hybrid()
    step_model(model, muon)
    plain_config = SpeedtronicConfig.from_dict({}).optimizer
    adamw, _ = build_optimizer(model, plain_config, warn=print)
    with pytest.raises(CheckpointError, match="optimizer state is muon's, this run's .* adamw"):
        adamw.load_state_dict(muon.state_dict())
    with pytest.raises(CheckpointError, match="optimizer state is adamw's, this run's .* muon"):
        muon.load_state_dict(adamw.state_dict())


def test_muon_defaults_derive_from_adamw_settings():
    config = lambda **o: SpeedtronicConfig.from_dict({"optimizer": {"name": "muon", **o}})  # noqa: E731
    spectral = config(lr=3e-3, weight_decay=0.1).optimizer
    assert muon_weight_decay(spectral) == pytest.approx(3e-3 * 0.1 / 0.02)  # per-step shrink
    rms = config(lr=3e-3, weight_decay=0.1, muon_lr_adjust="match_rms_adamw").optimizer
    model, optimizer, _ = hybrid(lr=3e-3, muon_lr_adjust="match_rms_adamw")
    group = optimizer.muon.param_groups[0]
    assert group["lr"] == 3e-3 and group["weight_decay"] == pytest.approx(0.1)
    assert muon_weight_decay(rms) == pytest.approx(0.1)


# ---- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        ({"name": "sgd"}, "optimizer.name: must be one of 'adamw', 'muon'"),
        ({"name": "muon", "muon_ns_steps": 0}, "optimizer.muon_ns_steps: must be in [1, 99]"),
        ({"name": "muon", "muon_momentum": 1.0}, "optimizer.muon_momentum: must be in [0, 1)"),
        ({"name": "muon", "muon_lr": -1}, "optimizer.muon_lr: must be > 0 or null"),
        ({"name": "muon", "muon_lr_adjust": "rms"}, "optimizer.muon_lr_adjust: must be one of"),
        ({"name": "muon", "muon_nesterov": "1"}, "optimizer.muon_nesterov: must be true or false"),
        ({"muon_lr": 0.02}, "optimizer.muon_lr: only with optimizer.name: muon (got 0.02 with"),
    ],
)
def test_muon_keys_are_validated(optimizer, message):
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict({"optimizer": optimizer})
    assert any(p.startswith(message) for p in caught.value.problems), caught.value.problems


def test_wsd_is_flat_then_decays_linearly_over_its_last_fraction():
    config = SpeedtronicConfig.from_dict(
        {"scheduler": {"name": "wsd", "warmup_steps": 10, "decay_fraction": 0.25}}
    ).scheduler
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0)
    scheduler = build_scheduler(opt, config, 100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10:75] == pytest.approx([1.0] * 65)
    assert lrs[75] == pytest.approx(1.0) and lrs[99] == pytest.approx(0.1 + 0.9 / 25)
    assert all(a > b for a, b in zip(lrs[75:], lrs[76:], strict=False))
    with pytest.raises(ConfigError, match="decay_fraction: only with scheduler.name: wsd"):
        SpeedtronicConfig.from_dict({"scheduler": {"decay_fraction": 0.5}})
    assert math.isclose(lrs[50], 1.0)

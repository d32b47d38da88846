"""Tests for speedtronic.model: shapes, causality, GQA, RoPE, loss, checkpointing, counts."""

import math

import pytest
import torch
import torch.nn.functional as F

import speedtronic.model as model_mod
from speedtronic.model import ReferenceConfig, ReferenceTransformer, apply_rope, rope_tables

VOCAB, SEQ = 32, 16


def tiny_config(**overrides) -> ReferenceConfig:
    kwargs = {"vocab_size": VOCAB, "seq_len": SEQ, "n_layer": 2, "n_head": 4, "d_model": 32}
    kwargs.update(overrides)
    return ReferenceConfig(**kwargs)


def tiny_model(seed: int = 0, **overrides) -> ReferenceTransformer:
    torch.manual_seed(seed)
    return ReferenceTransformer(tiny_config(**overrides))


def random_ids(batch: int = 2, length: int = SEQ, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=gen)


def test_logits_shape_and_shorter_inputs():
    model = tiny_model().eval()
    assert model(random_ids()).shape == (2, SEQ, VOCAB)
    assert model(random_ids(length=5)).shape == (2, 5, VOCAB)


def test_too_long_input_raises():
    model = tiny_model()
    with pytest.raises(ValueError, match=str(SEQ + 1)):
        model(random_ids(length=SEQ + 1))


def test_causality():
    model = tiny_model().eval()
    ids = random_ids()
    t = 7
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :t], after[:, :t], rtol=0, atol=1e-6)
    # The change must be visible from t on, or the check above proves nothing.
    assert not torch.allclose(before[:, t:], after[:, t:])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_documents_are_computed_as_if_alone(checkpointing):
    """``doc_ids``: each document of a packed row gets the logits, loss and gradients it has
    alone (attention within it, RoPE positions restarting), the padding after them aside."""
    model = tiny_model(n_kv_head=2).train()
    model.set_gradient_checkpointing(checkpointing)
    docs = [random_ids(1, n, seed=n)[0] for n in (5, 7, 3)]  # 15 positions, 1 of padding
    ids = torch.cat([*docs, torch.zeros(1, dtype=torch.long)])[None]
    doc_ids = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4])
    labels = torch.cat([torch.cat([d[1:], torch.tensor([-100])]) for d in docs] + [
        torch.tensor([-100])])[None]  # fmt: skip
    packed = model(ids, doc_ids=doc_ids)
    at = 0
    for doc in docs:
        alone = model(doc[None])
        torch.testing.assert_close(packed[:, at : at + len(doc)], alone, rtol=0, atol=1e-5)
        at += len(doc)
    loss, grads = _loss_and_grads(model, ids, labels, doc_ids=doc_ids)
    sums = [model(d[None, :-1], d[None, 1:]) * (len(d) - 1) for d in docs]
    alone = torch.stack(sums).sum() / sum(len(d) - 1 for d in docs)
    model.zero_grad(set_to_none=True)
    alone.backward()
    torch.testing.assert_close(loss, alone.detach(), rtol=0, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-6, msg=name)
    # one document is the plain causal forward (its fused kernel), to the rounding
    with torch.no_grad():
        whole = model(ids, doc_ids=torch.zeros_like(doc_ids))
        torch.testing.assert_close(whole, model(ids), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="doc_ids: shape"):
        model(ids, doc_ids=doc_ids[:, 1:])


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_gqa_shapes(n_kv_head):
    model = tiny_model(n_kv_head=n_kv_head).eval()
    head_dim = 32 // 4
    attn = model.blocks[0].attn
    assert attn.wq.weight.shape == (32, 32)
    assert attn.wk.weight.shape == (n_kv_head * head_dim, 32)
    assert attn.wv.weight.shape == (n_kv_head * head_dim, 32)
    assert torch.isfinite(model(random_ids())).all()


def test_gqa_equals_mha_with_shared_kv_heads():
    # Query head h must read K/V head h // (n_head // n_kv_head).
    gqa = tiny_model(n_kv_head=2).eval()
    mha = tiny_model(seed=5, n_kv_head=4).eval()
    state = dict(gqa.state_dict())
    head_dim = 8
    for name, tensor in gqa.state_dict().items():
        if name.endswith(("attn.wk.weight", "attn.wv.weight")):
            heads = tensor.view(2, head_dim, -1).repeat_interleave(2, dim=0)
            state[name] = heads.reshape(4 * head_dim, -1)
    mha.load_state_dict(state)
    ids = random_ids()
    with torch.no_grad():
        torch.testing.assert_close(gqa(ids), mha(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"n_kv_head": 3}, "n_kv_head"),
        ({"d_model": 30}, "d_model"),  # not divisible by n_head=4
        ({"d_model": 12}, "d_model"),  # head_dim 3 is odd
        ({"n_layer": 0}, "n_layer"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"mlp_hidden": 0}, "mlp_hidden"),
        ({"norm_eps": 0.0}, "norm_eps"),
    ],
)
def test_invalid_config_names_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_invalid_n_kv_head_message():
    with pytest.raises(ValueError) as info:
        tiny_config(n_kv_head=3)
    assert str(info.value) == "n_kv_head: must divide n_head=4 (got 3)"


def test_mlp_hidden_default():
    assert tiny_config(d_model=128).mlp_dim == 384  # int(341.33) rounded up to 64
    assert tiny_config(d_model=384, n_head=6).mlp_dim == 1024
    assert tiny_config(mlp_hidden=40).mlp_dim == 40


def test_tied_embeddings():
    tied = tiny_model()
    assert tied.lm_head.weight is tied.tok_emb.weight
    names = [name for name, _ in tied.named_parameters()]
    assert "tok_emb.weight" in names and "lm_head.weight" not in names
    untied = tiny_model(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() == tied.num_parameters() + VOCAB * 32


def test_loss_matches_manual_cross_entropy():
    model = tiny_model().eval()
    ids, labels = random_ids(), random_ids(seed=2)
    logits = model(ids)
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(model(ids, labels), expected)


def test_loss_respects_ignore_index():
    model = tiny_model().eval()
    ids, labels = random_ids(), random_ids(seed=2)
    ignored = labels.clone()
    ignored[0, :10] = -100
    ignored[1, 3] = -100
    logits = model(ids)
    keep = ignored != -100
    expected = F.cross_entropy(logits[keep], labels[keep])
    loss = model(ids, ignored)
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(loss, model(ids, labels))


def test_all_ignored_loss_is_zero_with_grad():
    model = tiny_model()
    ids = random_ids()
    loss = model(ids, torch.full_like(ids, -100))
    assert torch.isfinite(loss) and loss.item() == 0.0
    assert loss.dim() == 0 and loss.grad_fn is not None
    loss.backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def _loss_and_grads(model, ids, labels, **extra):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels, **extra)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_checkpointing_matches(monkeypatch):
    calls = []

    def counting_checkpoint(*args, **kwargs):
        calls.append(kwargs.get("use_reentrant"))
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(model_mod, "checkpoint", counting_checkpoint)
    model = tiny_model().train()
    ids, labels = random_ids(), random_ids(seed=2)
    loss_off, grads_off = _loss_and_grads(model, ids, labels)
    assert calls == []
    model.set_gradient_checkpointing(True)
    loss_on, grads_on = _loss_and_grads(model, ids, labels)
    assert calls == [False, False]  # one per block, non-reentrant
    torch.testing.assert_close(loss_on, loss_off)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, msg=name)
    model.eval()
    model(ids, labels)
    assert len(calls) == 2  # no checkpointing outside training


def _expected_param_count(cfg: ReferenceConfig) -> int:
    d, hd = cfg.d_model, cfg.head_dim
    attn = 2 * d * d + 2 * d * cfg.kv_heads * hd
    mlp = 3 * d * cfg.mlp_dim
    per_block = attn + mlp + 2 * d
    emb = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return emb + cfg.n_layer * per_block + d


@pytest.mark.parametrize("tie", [True, False])
def test_num_parameters_and_flops(tie):
    model = tiny_model(n_kv_head=2, tie_embeddings=tie)
    cfg = model.config
    n = model.num_parameters()
    assert n == sum(p.numel() for p in model.parameters())
    assert n == _expected_param_count(cfg)
    assert model.num_parameters(exclude_embeddings=True) == n - VOCAB * 32
    matmul_params = n if tie else n - VOCAB * 32
    assert model.flops_per_token() == 6 * matmul_params + 12 * 2 * 32 * SEQ
    assert model.flops_per_token(seq_len=4) == 6 * matmul_params + 12 * 2 * 32 * 4


def test_init_statistics():
    torch.manual_seed(0)
    cfg = ReferenceConfig(vocab_size=512, seq_len=8, n_layer=4, n_head=4, d_model=256)
    model = ReferenceTransformer(cfg)
    block = model.blocks[0]
    assert abs(block.attn.wq.weight.std().item() - 0.02) < 0.002
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 0.002
    residual_std = 0.02 / math.sqrt(2 * 4)
    assert abs(block.attn.wo.weight.std().item() - residual_std) < 0.001
    assert abs(block.mlp.w_down.weight.std().item() - residual_std) < 0.001
    assert torch.equal(block.attn_norm.weight, torch.ones(256))
    assert all(name.endswith("weight") for name, _ in model.named_parameters())  # no biases


def test_rope_is_relative_and_norm_preserving():
    cos, sin = rope_tables(SEQ, 8, 10000.0)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=gen), torch.randn(1, 1, 1, 8, generator=gen)

    def score(m, n):
        return (apply_rope(q, cos[m : m + 1], sin[m : m + 1]) * apply_rope(k, cos[n], sin[n])).sum()

    torch.testing.assert_close(score(5, 2), score(12, 9))
    assert not torch.allclose(score(5, 2), score(5, 3))
    rotated = apply_rope(q, cos[7], sin[7])
    torch.testing.assert_close(rotated.norm(), q.norm())


def test_learns_repeating_sequence():
    model = tiny_model()
    pattern = torch.arange(8).repeat(SEQ // 8 + 1)[: SEQ + 1]
    batch = pattern.unsqueeze(0).repeat(4, 1)
    ids, labels = batch[:, :-1], batch[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss = model(ids, labels)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 3.0  # about ln(32) at init
    assert model(ids, labels).item() < 0.3


def test_meta_device_init():
    with torch.device("meta"):
        model = ReferenceTransformer(tiny_config())
    model.to_empty(device="cpu")
    model.init_weights()
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.num_parameters() == tiny_model().num_parameters()
    reference = tiny_model()
    torch.testing.assert_close(model.rope_cos, reference.rope_cos)
    torch.testing.assert_close(model.rope_sin, reference.rope_sin)
    assert torch.isfinite(model(random_ids(), random_ids(seed=2)))


def test_state_dict_has_only_parameters():
    model = tiny_model()
    keys = set(model.state_dict())
    assert not any("rope" in key for key in keys)
    param_names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    assert keys == param_names
    assert "blocks.0.mlp.w_gate.weight" in keys and "lm_head.weight" in keys


def test_bf16_autocast_close_to_fp32():
    model = tiny_model().eval()
    ids, labels = random_ids(), random_ids(seed=2)
    with torch.no_grad():
        fp32 = model(ids, labels)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(ids, labels)
            logits = model(ids)
    assert bf16.dtype == torch.float32
    assert logits.dtype == torch.bfloat16  # autocast really ran
    assert torch.isfinite(bf16)
    assert abs(bf16.item() - fp32.item()) < 0.05

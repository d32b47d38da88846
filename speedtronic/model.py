"""The reference GPT-style decoder-only transformer that Speedtronic trains by default.

This module owns the model architecture and nothing else: ``ReferenceConfig`` (sizes,
validated on construction), ``ReferenceTransformer`` (token embedding, pre-norm blocks of
RMSNorm + causal grouped-query attention with RoPE + SwiGLU MLP, final RMSNorm, LM head tied
to the embedding by default; what pretrained models need as options: an untied head, a q/k/v
bias as Qwen2's, a head width of its own, Llama-3's RoPE scaling), its weight init, its loss
(mean cross-entropy over labels that are not -100, computed in float32), packed examples
(``doc_ids``: attention within each document, RoPE positions restarting at its start),
optional per-block activation checkpointing, the parameter / FLOP counts used for throughput
and MFU reporting, and incremental decoding for generation (``new_cache`` /
``forward_cached`` over a ``KVCache``, beside the training forward, which it leaves as it
is). It imports only torch and the standard library so it can be read, copied and tested on
its own; it must run eagerly, under ``torch.autocast`` and under ``torch.compile`` on CPU, CUDA
and MPS with torch>=2.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


@dataclass
class ReferenceConfig:
    vocab_size: int = 256
    seq_len: int = 128  # maximum context length; RoPE tables are sized to this
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int | None = None  # None -> n_head (plain multi-head attention)
    d_model: int = 128
    mlp_hidden: int | None = None  # None -> 8/3 * d_model rounded up to a multiple of 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    tie_embeddings: bool = True
    # What common pretrained models need (``speedtronic import``); the defaults are Llama's.
    head_dim: int | None = None  # None -> d_model / n_head; else queries are n_head x head_dim
    qkv_bias: bool = False  # a bias on the query, key and value projections (Qwen2)
    # Llama-3 RoPE scaling: (factor, low_freq_factor, high_freq_factor, original context length)
    rope_scaling: tuple[float, float, float, int] | None = None
    # Options measured by benchmarks/optim/time_to_quality.py (docs/benchmarks.md), off by default.
    # qk_norm changes the architecture (RMSNorm of each head's queries and keys before RoPE,
    # as Qwen3/OLMo 2 do): a checkpoint with it is no longer a LlamaForCausalLM.
    qk_norm: bool = False
    zero_init_projections: bool = False  # attention and MLP output projections start at 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            _check_positive_int(name, getattr(self, name))
        for name in ("n_kv_head", "mlp_hidden", "head_dim"):
            if getattr(self, name) is not None:
                _check_positive_int(name, getattr(self, name))
        for name in ("rope_theta", "norm_eps", "init_std"):
            _check_positive_float(name, getattr(self, name))
        if self.head_dim is None and self.d_model % self.n_head != 0:
            raise ValueError(
                f"d_model: must be divisible by n_head={self.n_head} (got {self.d_model})"
            )
        if self.head_dim is not None and self.head_dim % 2 != 0:
            raise ValueError(f"head_dim: must be even for RoPE (got {self.head_dim})")
        if self.head_dim is None and (self.d_model // self.n_head) % 2 != 0:
            raise ValueError(
                f"d_model: head_dim = d_model / n_head must be even for RoPE (got d_model="
                f"{self.d_model}, n_head={self.n_head} -> head_dim={self.d_model // self.n_head})"
            )
        if self.head_dim is None:  # resolved here: every reader sees the width in use
            self.head_dim = self.d_model // self.n_head
        if self.rope_scaling is not None:
            _check_llama3_scaling(self.rope_scaling)
        if self.n_head % self.kv_heads != 0:
            raise ValueError(f"n_kv_head: must divide n_head={self.n_head} (got {self.n_kv_head})")

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads, with the ``None`` default resolved."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def mlp_dim(self) -> int:
        """The SwiGLU hidden width, with the ``None`` default resolved."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        # 8/3 keeps SwiGLU's three matrices at the cost of a 4x GELU MLP; 64 suits matmul tiles.
        return -(-int(8 * self.d_model / 3) // 64) * 64

    def parameter_count(self) -> int:
        """``ReferenceTransformer(self).num_parameters()`` from the sizes alone (tied weights
        once), without building the model: ``validate`` answers at once for any size."""
        d, kv, q = self.d_model, self.kv_heads * self.head_dim, self.n_head * self.head_dim
        block = 2 * d * q + 2 * d * kv + 3 * d * self.mlp_dim + 2 * d  # attention, MLP, norms
        block += q + 2 * kv if self.qkv_bias else 0
        block += 2 * self.head_dim if self.qk_norm else 0  # the query and key norms' gains
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layer * block + d + head


def _check_positive_int(name: str, value: object) -> None:
    # bool is an int subclass; "n_layer: true" in a YAML file is a typo, not a size.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: must be a positive integer (got {value!r})")


def _check_positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: must be a positive number (got {value!r})")


def _check_llama3_scaling(scaling) -> None:
    if len(scaling) != 4 or not all(isinstance(v, (int, float)) and v > 0 for v in scaling):
        raise ValueError(
            "rope_scaling: must be 4 positive numbers (factor, low_freq_factor, "
            f"high_freq_factor, original context length) (got {scaling!r})"
        )
    if not scaling[1] < scaling[2]:
        raise ValueError(f"rope_scaling: low_freq_factor must be < high_freq_factor ({scaling})")


def llama3_frequencies(inv_freq: torch.Tensor, scaling) -> torch.Tensor:
    """Llama-3's RoPE scaling: long wavelengths slowed by ``factor``, short ones kept, a smooth
    blend between (as Meta's reference code and transformers' ``rope_type: llama3``)."""
    factor, low, high, original = (float(v) for v in scaling)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def rope_tables(seq_len: int, head_dim: int, theta: float, device=None, scaling=None):
    """Return float32 ``(cos, sin)``, each ``(seq_len, head_dim // 2)``, for rotary embeddings;
    ``scaling``: ReferenceConfig.rope_scaling (Llama-3's), None for plain RoPE."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    if scaling is not None:
        inv_freq = llama3_frequencies(inv_freq, scaling)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)  # (seq_len, head_dim // 2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, H, T, D) by position; pairs are (i, i + D/2), as in GPT-NeoX/Llama-HF."""
    # float32 because bf16 angles lose relative-position precision at long context.
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)  # (B, H, T, D/2) each
    cos, sin = cos.float(), sin.float()  # (T, D/2), broadcast over B and H
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


class RMSNorm(nn.Module):
    # Hand-written because nn.RMSNorm needs torch>=2.4.
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32 so the mean of squares neither overflows in fp16 nor rounds away in bf16.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


class KVCache:
    """Keys and values of the positions seen so far, per block, for decoding one token at a time.

    ``k[layer]`` and ``v[layer]`` are ``(B, Hkv, max_len, D)``; ``length`` positions are filled.
    """

    def __init__(self, config: ReferenceConfig, batch: int, max_len: int, device, dtype):
        shape = (batch, config.kv_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.length, self.max_len = 0, max_len


# SDPA reads grouped K/V heads itself from torch 2.5 on: no copy of the whole cache per step.
_SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


class Attention(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_dim = config.head_dim
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        bias = config.qkv_bias
        self.wq = nn.Linear(config.d_model, q_dim, bias=bias)
        self.wk = nn.Linear(config.d_model, kv_dim, bias=bias)
        self.wv = nn.Linear(config.d_model, kv_dim, bias=bias)
        self.wo = nn.Linear(q_dim, config.d_model, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries (B, H, T, D), keys and values (B, Hkv, T, D), RoPE applied to q and k."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        if hasattr(self, "q_norm"):  # qk_norm: each head's vectors to unit RMS, then a gain
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask=None):
        """``mask``: None (causal) or a boolean (B, 1, T, T), True where a query may look."""
        B, T, C = x.shape
        q, k, v = self._qkv(x, cos, sin)
        groups = self.n_head // self.n_kv_head
        if groups > 1:
            # Query head h reads K/V head h // groups. SDPA's enable_gqa needs torch>=2.5.
            k = k.repeat_interleave(groups, dim=1)  # (B, H, T, D)
            v = v.repeat_interleave(groups, dim=1)  # (B, H, T, D)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))

    def forward_cached(self, x, cos, sin, cache: KVCache, layer: int) -> torch.Tensor:
        """``forward`` for ``x`` at positions ``cache.length ...``, attending to the cache too.

        The same arithmetic as ``forward`` (tests hold the two equal); the caller advances
        ``cache.length`` once every block has written its keys and values.
        """
        B, T, C = x.shape
        q, k, v = self._qkv(x, cos, sin)
        start, end = cache.length, cache.length + T
        cache.k[layer][:, :, start:end] = k
        cache.v[layer][:, :, start:end] = v
        k, v = cache.k[layer][:, :, :end], cache.v[layer][:, :, :end]  # (B, Hkv, end, D)
        groups, gqa = self.n_head // self.n_kv_head, {}
        if groups > 1 and _SDPA_GQA:
            gqa = {"enable_gqa": True}
        elif groups > 1:
            k = k.repeat_interleave(groups, dim=1)  # (B, H, end, D)
            v = v.repeat_interleave(groups, dim=1)  # (B, H, end, D)
        k, v = k.to(q.dtype), v.to(q.dtype)
        if start == 0:  # a prompt: plain causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        else:  # position start + i sees keys 0 .. start + i (one new token: all of them)
            mask = None if T == 1 else torch.ones(T, end, dtype=torch.bool, device=x.device)
            mask = None if mask is None else mask.tril(diagonal=start)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.w_gate = nn.Linear(config.d_model, config.mlp_dim, bias=False)
        self.w_up = nn.Linear(config.d_model, config.mlp_dim, bias=False)
        self.w_down = nn.Linear(config.mlp_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)  # (B, T, C)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, C)

    def forward_cached(self, x, cos, sin, cache: KVCache, layer: int) -> torch.Tensor:
        x = x + self.attn.forward_cached(self.attn_norm(x), cos, sin, cache, layer)  # (B, T, C)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, C)


class ReferenceTransformer(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.config = config
        self.gradient_checkpointing = False
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._tie_weights()
        # Non-persistent: derived from the config, so checkpoints hold only parameters.
        cos, sin = rope_tables(
            config.seq_len, config.head_dim, config.rope_theta, scaling=config.rope_scaling
        )
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialize parameters and RoPE tables in place, e.g. after meta-device to_empty()."""
        cfg = self.config
        self._tie_weights()  # to_empty() from the meta device replaces, and so unties, parameters
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        # GPT-2: each block adds two residual branches; scaling keeps the stream's variance flat.
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        for block in self.blocks:
            for proj in (block.attn.wo, block.mlp.w_down):
                if cfg.zero_init_projections:  # each block starts as the identity (speedrun)
                    nn.init.zeros_(proj.weight)
                else:
                    nn.init.normal_(proj.weight, mean=0.0, std=residual_std)
        cos, sin = rope_tables(
            cfg.seq_len, cfg.head_dim, cfg.rope_theta, self.rope_cos.device, cfg.rope_scaling
        )
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def _tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, vocab) without ``labels``; else the mean CE over labels != -100.

        ``labels`` are already aligned: ``labels[:, t]`` is the target for position ``t``.
        ``doc_ids`` (B, T), packed examples: the document of each position (equal within a run
        of positions); each is computed as if alone: attention stays within it, RoPE positions
        restart at its start. None: one causal sequence (the fused ``is_causal`` kernel).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected shape (B, T), got {tuple(input_ids.shape)}")
        T = input_ids.shape[1]
        if T > self.config.seq_len:
            raise ValueError(
                f"input_ids: sequence length {T} exceeds seq_len={self.config.seq_len}"
            )
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(
                f"labels: shape {tuple(labels.shape)} must match input_ids {tuple(input_ids.shape)}"
            )
        cos, sin, mask = self.rope_cos[:T], self.rope_sin[:T], None  # (T, D/2)
        if doc_ids is not None:
            if doc_ids.shape != input_ids.shape:
                raise ValueError(
                    f"doc_ids: shape {tuple(doc_ids.shape)} must match input_ids "
                    f"{tuple(input_ids.shape)}"
                )
            cos, sin, mask = self._documents(doc_ids)
        x = self.tok_emb(input_ids)  # (B, T, C)
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, cos, sin, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        if labels is None:
            return logits
        return self._loss(logits, labels)

    def _documents(self, doc_ids: torch.Tensor):
        """RoPE tables (B, 1, T, D/2) at positions restarting with each document, and the
        block-diagonal causal mask (B, 1, T, T) that keeps attention within one."""
        B, T = doc_ids.shape
        at = torch.arange(T, device=doc_ids.device).expand(B, T)
        starts = torch.ones_like(doc_ids, dtype=torch.bool)
        starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
        first = torch.where(starts, at, torch.zeros_like(at)).cummax(dim=1).values
        positions = at - first  # (B, T): 0 at each document's first token
        cos, sin = self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]
        same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
        return cos, sin, (same & causal)[:, None]

    def new_cache(self, batch: int, max_len: int | None = None, dtype=None) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_len`` (default seq_len)."""
        max_len = self.config.seq_len if max_len is None else max_len
        if not 0 < max_len <= self.config.seq_len:
            raise ValueError(f"max_len: must be in [1, seq_len={self.config.seq_len}] ({max_len})")
        weight = self.tok_emb.weight
        return KVCache(self.config, batch, max_len, weight.device, dtype or weight.dtype)

    @torch.no_grad()
    def forward_cached(
        self, input_ids: torch.Tensor, cache: KVCache, last_only: bool = False
    ) -> torch.Tensor:
        """Logits (B, T, vocab) of ``input_ids`` placed after the ``cache.length`` positions the
        cache holds, which it then holds too; ``last_only``: the last position's (B, 1, vocab).

        Inference only (no grad, no checkpointing): what ``speedtronic generate`` decodes with.
        """
        T, start = input_ids.shape[1], cache.length
        if start + T > cache.max_len:
            raise ValueError(
                f"input_ids: {start} + {T} positions exceed the cache ({cache.max_len})"
            )
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]  # (T, D/2)
        x = self.tok_emb(input_ids)  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block.forward_cached(x, cos, sin, cache, layer)
        cache.length += T
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        return self.lm_head(self.norm(x))  # (B, T, vocab)

    @staticmethod
    def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # float32: bf16 log-softmax over a large vocabulary is visibly off.
        total = F.cross_entropy(
            logits.float().flatten(0, 1),  # (B*T, vocab)
            labels.flatten(),  # (B*T,)
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        # sum / clamp(count, 1) instead of reduction="mean": an all-ignored batch gives 0, not
        # NaN, and the graph stays free of host syncs for torch.compile.
        count = (labels != IGNORE_INDEX).sum().clamp(min=1)
        return total / count

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The blocks' projection matrices: what Muon optimizes (``speedtronic.optim.param_split``).

        Not the embedding, nor the head it is tied to (or an untied head), nor the norms.
        """
        return [m.weight for b in self.blocks for m in b.modules() if isinstance(m, nn.Linear)]

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Recompute each block's activations in backward (training only) to save memory."""
        self.gradient_checkpointing = bool(enabled)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Count parameters, tied weights once; optionally without the token-embedding table.

        With tied embeddings, excluding the table also excludes the LM head it doubles as.
        """
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6*N + 12*n_layer*d_model*seq_len (PaLM / nanoGPT).

        N counts parameters that take part in a matmul: every parameter, with a tied embedding
        counted once as the LM head. An untied input-embedding table is a lookup and is left out.
        """
        cfg = self.config
        seq_len = cfg.seq_len if seq_len is None else seq_len
        n = self.num_parameters()
        if not cfg.tie_embeddings:
            n -= self.tok_emb.weight.numel()
        return float(6 * n + 12 * cfg.n_layer * cfg.d_model * seq_len)

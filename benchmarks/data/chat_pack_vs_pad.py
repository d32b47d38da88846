"""Chat SFT examples padded or packed: tokens trained on per second (issue 56 item 1).

Usage::

    python benchmarks/data/chat_pack_vs_pad.py            # ~1 min on 2 CPU cores
    python benchmarks/data/chat_pack_vs_pad.py --steps 20 --seq-len 1024

The reference decoder (4 layers, d_model 256, vocabulary 4,096; ~4M parameters) trains with
AdamW on synthetic conversations whose lengths are log-normal (median ``--median`` tokens,
clipped to [16, seq_len]), 60% of each an assistant answer (the labels trained on):

* **padded** (``data tokenize --chat --pad``): one conversation per row of ``seq_len``, the
  rest padding (labels -100), the model's plain forward (``is_causal``: the fused kernels);
* **packed** (``data tokenize --chat``, the default): conversations laid first-fit into rows
  (none split), the model's forward with ``doc_ids`` (what a packed folder's batches carry): a
  block-diagonal causal mask (``scaled_dot_product_attention``'s ``attn_mask``, how document
  masking runs without varlen kernels) and RoPE positions restarting per conversation.

Each step is a micro-batch of ``--batch`` rows; the steps alternate the two sides after a
warm-up, and the median step time of each gives tokens trained on per second. The cores are
shared on the machines these ran on: the ratio, measured in the same run, is the figure.
One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from speedtronic import model as reference  # noqa: E402


def lengths(n: int, median: int, seq_len: int, generator: torch.Generator) -> list[int]:
    drawn = torch.exp(torch.randn(n, generator=generator) * 0.8) * median
    return drawn.clamp(16, seq_len).long().tolist()


def padded(convs: list[int], batch: int, seq_len: int, vocab: int):
    rows = convs[:batch]
    ids = torch.randint(0, vocab, (batch, seq_len))
    labels = torch.full((batch, seq_len), -100)
    for r, n in enumerate(rows):
        answer = int(n * 0.6)
        labels[r, n - answer : n] = ids[r, n - answer : n]
    return ids, labels, None


def packed(convs: list[int], batch: int, seq_len: int, vocab: int):
    rows: list[list[int]] = [[] for _ in range(batch)]
    for n in convs:
        for row in rows:
            if sum(row) + n <= seq_len:
                row.append(n)
                break
    ids = torch.randint(0, vocab, (batch, seq_len))
    labels = torch.full((batch, seq_len), -100)
    doc = torch.zeros((batch, seq_len), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for d, n in enumerate(row):
            answer = int(n * 0.6)
            labels[r, at + n - answer : at + n] = ids[r, at + n - answer : at + n]
            doc[r, at:] = d  # the tail's padding joins the last one, as the loader's does
            at += n
    return ids, labels, doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--median", type=int, default=120)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = reference.ReferenceConfig(
        vocab_size=4096, seq_len=args.seq_len, n_layer=4, n_head=4, d_model=256
    )
    model = reference.ReferenceTransformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    trained: dict[str, list[int]] = {"padded": [], "packed": []}
    for step in range(args.steps + 2):
        convs = lengths(64, args.median, args.seq_len, generator)
        for side, build in (("padded", padded), ("packed", packed)):
            ids, labels, doc_ids = build(convs, args.batch, args.seq_len, config.vocab_size)
            start = time.perf_counter()
            loss = model(ids, labels, doc_ids=doc_ids)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step >= 2:  # warm-up steps are not counted
                times[side].append(time.perf_counter() - start)
                trained[side].append(int((labels != -100).sum()))
    result = {}
    for side in times:
        median = statistics.median(times[side])
        per_step = statistics.mean(trained[side])
        result[side] = {
            "step_s": round(median, 4),
            "trained_tokens_per_step": per_step,
            "trained_tokens_per_s": round(per_step / median, 1),
        }
    ratio = result["packed"]["trained_tokens_per_s"] / result["padded"]["trained_tokens_per_s"]
    print(f"{'side':8} {'step s':>8} {'trained/step':>13} {'trained tok/s':>14}")
    for side, r in result.items():
        print(
            f"{side:8} {r['step_s']:8.3f} {r['trained_tokens_per_step']:13.0f} "
            f"{r['trained_tokens_per_s']:14.0f}"
        )
    print(f"packed / padded trained tokens per second: {ratio:.2f}x")
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    print(json.dumps({"benchmark": "chat_pack_vs_pad", **vars(args), **result,
                      "ratio": round(ratio, 3), "machine": machine,
                      "threads": torch.get_num_threads()}))  # fmt: skip


if __name__ == "__main__":
    main()

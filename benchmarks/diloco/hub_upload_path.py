"""The Hub upload path: what Xet's dedup would save on DiLoCo's files; what each operation costs.

Usage::

    python benchmarks/diloco/hub_upload_path.py             # ~10M model, 2 inner loops of 5 steps
    python benchmarks/diloco/hub_upload_path.py --quick     # the smoke-sized model (seconds)

(a) Xet dedup. huggingface_hub 2.4 sends uploads through hf_xet when it is installed, whose
selling point is chunk-level dedup: a file that shares content-defined chunks with what the
repo already holds uploads only the new ones. Speedtronic sends its files through the Git LFS
path instead (docs/hub.md says why). This measures what that gives up, with hf_xet's own
chunker and dedup (``XetSession`` on a local CAS, no network): two consecutive real deltas
(bf16, the default encoding) and two consecutive real globals (fp32) of the reference model
trained with AdamW on random tokens, each second file uploaded after the first. Controls in
the same run: the same file uploaded twice (everything dedups) and random bytes of the same
size (nothing does).

(b) Requests per operation. The real ``HubTransport`` and ``HubClient`` against the Hub
emulator (tests/hub_emulator.py, answering as the Hub does: LFS for ``*.safetensors``), every
request of every operation counted by origin: Hub API calls (what the Hub's rate limit counts)
and storage requests (the LFS PUTs and downloads, on another origin).

Prints two tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the Hub emulator
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="speedtronic-hf-home-"))

TEN_M = dict(vocab_size=256, seq_len=256, n_layer=6, n_head=6, n_kv_head=3, d_model=384)
SMOKE = dict(vocab_size=256, seq_len=64, n_layer=2, n_head=4, d_model=128)


def consecutive_files(model_args: dict, inner_steps: int) -> dict[str, tuple[bytes, bytes]]:
    """Two consecutive deltas (bf16) and globals (fp32) of a real training run."""
    import torch

    from speedtronic.distributed.codec import encode_delta, encode_weights, pseudo_gradient
    from speedtronic.distributed.protocol import DeltaHeader
    from speedtronic.registry import build_model

    torch.manual_seed(0)
    model = build_model("reference_transformer", model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def state() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone().float() for k, v in model.named_parameters()}

    def train() -> None:
        for _ in range(inner_steps):
            tokens = torch.randint(0, model_args["vocab_size"], (4, model_args["seq_len"] + 1))
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    states = [state()]
    for _ in range(2):
        train()
        states.append(state())
    deltas = [
        encode_delta(
            pseudo_gradient(states[i], states[i + 1]),
            DeltaHeader("bench", i + 1, i, inner_steps, 1, "bf16", "2026-01-01T00:00:00Z"),
        )
        for i in range(2)
    ]
    globals_ = [encode_weights(states[i + 1], i + 1) for i in range(2)]
    return {"deltas (bf16)": tuple(deltas), "globals (fp32)": tuple(globals_)}


def xet_second_upload(first: bytes, second: bytes) -> dict:
    """hf_xet's dedup metrics for ``second``, uploaded to a local CAS that holds ``first``."""
    import hf_xet

    session = hf_xet.XetSession()
    with tempfile.TemporaryDirectory(prefix="speedtronic-xet-cas-") as cas:
        metrics = None
        for data in (first, second):
            commit = session.new_upload_commit(endpoint=f"local://{cas}")
            commit.start_upload_bytes(data)
            metrics = commit.wait_to_finish().dedup_metrics
    return {
        "bytes": metrics.total_bytes,
        "deduped_bytes": metrics.deduped_bytes,
        "new_bytes": metrics.new_bytes,
        "chunks": metrics.total_chunks,
        "deduped_chunks": metrics.deduped_chunks,
        "uploaded_bytes": metrics.xorb_bytes_uploaded + metrics.shard_bytes_uploaded,
    }


def dedup_rows(model_args: dict, inner_steps: int) -> list[dict]:
    rows = []
    for name, (first, second) in consecutive_files(model_args, inner_steps).items():
        rows.append({"pair": f"consecutive {name}", **xet_second_upload(first, second)})
    rows.append({"pair": "control: the same global twice", **xet_second_upload(second, second)})
    noise = os.urandom(len(second))
    control = xet_second_upload(os.urandom(len(second)), noise)
    rows.append({"pair": "control: random bytes", **control})
    for row in rows:
        row["dedup_share"] = row["deduped_bytes"] / row["bytes"] if row["bytes"] else 0.0
    return rows


def request_rows() -> list[dict]:
    """Requests per operation of the real transport against the Hub emulator."""
    from hub_emulator import HubEmulator

    from speedtronic.distributed.hub.transport import HubTransport
    from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, delta_path
    from speedtronic.hub.client import HubClient

    rows = []
    with HubEmulator({"hf_bench": "alice"}) as emu, tempfile.TemporaryDirectory() as cache:
        emu.create_repo("alice/run", private=True)

        def node(name: str) -> tuple[HubTransport, HubClient]:
            client = HubClient("alice/run", token="hf_bench", endpoint=emu.url, cache_dir=cache)
            return HubTransport(client), client

        (master, mc), (worker, wc) = node("master"), node("worker")

        def measure(what: str, client: HubClient, fn, *args) -> None:
            api, storage = client.budget.calls(3600), client.budget.storage(3600)
            logged = len(emu.requests), len(emu.storage.requests)
            fn(*args)
            row = {"operation": what, "api": client.budget.calls(3600) - api}
            row["storage"] = client.budget.storage(3600) - storage
            row["logged"] = [len(emu.requests) - logged[0], len(emu.storage.requests) - logged[1]]
            rows.append(row)

        delta = bytes(range(256)) * 64
        master.list_deltas()
        measure("idle poll (master: head)", mc, master.list_deltas)
        measure("delta upload (worker)", wc, worker.upload, delta_path("worker", 1), delta)
        measure("poll after a commit (head, listing)", mc, master.list_deltas)
        measure("delta read (master)", mc, master.read, delta_path("worker", 1), 1 << 20)
        step = {"outer_step": 1, "format": 1}
        weights = b"\0" + bytes(range(256)) * 256
        measure("publish (master)", mc, master.publish, weights, step, [delta_path("worker", 1)])
        measure("step count read (worker: head, file)", wc, worker.read_step_count)
        measure("global weights read (worker)", wc, worker.read, GLOBAL_WEIGHTS, 1 << 20)
        assert not [p for _, p, _ in emu.requests if "xet" in p]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smoke-sized model")
    parser.add_argument("--inner-steps", type=int, default=5)
    args = parser.parse_args()
    model_args = SMOKE if args.quick else TEN_M
    dedup = dedup_rows(model_args, args.inner_steps)
    print(f"(a) hf_xet dedup of the second file of a pair ({args.inner_steps} AdamW steps apart)")
    print(f"  {'pair':36} {'bytes':>12} {'chunks':>7} {'deduped':>8} {'share':>7} {'sent':>12}")
    for r in dedup:
        print(
            f"  {r['pair']:36} {r['bytes']:>12,} {r['chunks']:>7} {r['deduped_chunks']:>8} "
            f"{r['dedup_share']:>7.2%} {r['uploaded_bytes']:>12,}"
        )
    requests = request_rows()
    print("(b) requests per operation, against the Hub emulator (client's count = emulator's log)")
    print(f"  {'operation':40} {'API':>4} {'storage':>8}")
    for r in requests:
        assert r["logged"] == [r["api"], r["storage"]], r  # nothing bypassed the hooks
        print(f"  {r['operation']:40} {r['api']:>4} {r['storage']:>8}")
    print(json.dumps({"model": model_args, "dedup": dedup, "requests": requests}))


if __name__ == "__main__":
    main()

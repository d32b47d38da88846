"""Import speed and memory: ``speedtronic import`` against transformers' ``from_pretrained``.

Usage::

    python benchmarks/modelout/import.py                 # SmolLM2-135M's shape, bf16, 2 rounds
    python benchmarks/modelout/import.py --layers 6 --rounds 3

A random Llama of SmolLM2-135M's shape (576 wide, 30 layers, 9/3 heads, 49,152 tokens, tied,
bfloat16 as the Hub ships it; ``--layers`` fewer for a quick run) is written once by
transformers' ``save_pretrained``. Each round then runs, in a fresh subprocess each so that
peak RSS is the arm's own (``VmHWM``, minus the interpreter-and-imports baseline the same
subprocess measured before starting): ``speedtronic.modelout.importer.import_model(SRC, OUT)``
(read, map, write a step-0 run directory, fsynced) and
``AutoModelForCausalLM.from_pretrained(SRC)`` (read and build the model in memory; it writes
nothing). Arms alternate ABBA. Reported: each arm's median seconds, the median ratio
speedtronic/transformers (goal <= 1.0), and each arm's peak RSS above its baseline against the
size of the weights file (import streams the tensors: about one copy of the model).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
ARM_CODE = {
    "speedtronic": (
        "from speedtronic.modelout.importer import import_model\nimport_model(SRC, OUT)\n"
    ),
    "transformers": (
        "from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained(SRC)\n"
    ),
}
ARM = """
import json, sys, time
import torch, safetensors, transformers  # both arms pay the same imports before the clock
SRC, OUT = sys.argv[1], sys.argv[2]
def hwm():  # peak RSS in KiB, as the kernel counts it
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
base = hwm()
start = time.perf_counter()
{code}
seconds = time.perf_counter() - start
peak = hwm()
above = (peak - base) / 1024
print(json.dumps({{"seconds": seconds, "base_mb": base / 1024, "rss_above_base_mb": above}}))
"""


def write_source(folder: Path, layers: int) -> int:
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = transformers.LlamaConfig(**SHAPE, num_hidden_layers=layers)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.tie_weights()  # to_empty gave the head a tensor of its own
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def run_arm(arm: str, src: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    code = ARM.format(code=ARM_CODE[arm])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out)],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30, help="SmolLM2-135M has 30")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="import-bench-") as scratch:
        src = Path(scratch) / "src"
        params = write_source(src, args.layers)
        weights_mb = (src / "model.safetensors").stat().st_size / 2**20
        results: dict[str, list[dict]] = {"speedtronic": [], "transformers": []}
        for r in range(args.rounds):
            order = (
                ["speedtronic", "transformers"] if r % 2 == 0 else ["transformers", "speedtronic"]
            )
            for arm in order:
                results[arm].append(run_arm(arm, src, Path(scratch) / "out"))
    seconds = {arm: statistics.median(x["seconds"] for x in rs) for arm, rs in results.items()}
    rss = {arm: max(x["rss_above_base_mb"] for x in rs) for arm, rs in results.items()}
    ratios = [
        s["seconds"] / t["seconds"]
        for s, t in zip(results["speedtronic"], results["transformers"], strict=True)
    ]
    load = os.getloadavg()[0]
    print(f"model: {params / 1e6:.1f}M parameters, {args.layers} layers, bf16, "
          f"{weights_mb:.0f} MB of weights; {args.rounds} rounds, load {load:.2f}")  # fmt: skip
    print(f"{'arm':<14}{'median s':>10}{'peak RSS above base':>22}")
    for arm in results:
        print(f"{arm:<14}{seconds[arm]:>10.2f}{rss[arm]:>18.0f} MB")
    print(f"ratio speedtronic/transformers: median {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}); goal <= 1.0")  # fmt: skip
    summary = {
        "benchmark": "import",
        "params": params,
        "layers": args.layers,
        "weights_mb": weights_mb,
        "seconds": seconds,
        "ratio_median": statistics.median(ratios),
        "peak_rss_above_base_mb": rss,
        "base_mb": {arm: rs[0]["base_mb"] for arm, rs in results.items()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

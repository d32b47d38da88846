"""Peak memory of ``speedtronic data tokenize``: a gzip bomb against a normal corpus (issue 35).

Usage::

    python benchmarks/data/tokenize_memory.py              # ~1.5 min on 2 cores
    python benchmarks/data/tokenize_memory.py --bomb-mb 256 --code /path/to/other/checkout

Each case is the real command in a fresh child process; a probe process runs it and reads
``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the peak resident set of the largest process of the
run (the command or one of its workers), not their sum. The cases, in ``--workdir``:

* **imports**: ``python -c "import speedtronic.data.ingest.pipeline"``, the floor;
* **normal**: ``--normal-mb`` of JSON Lines (documents of ~2 KB) gzipped, ``--workers 2``;
* **bomb**: a newline-free gzip member of ``--bomb-mb`` (1 GB by default, ~1 MB on disk), the
  default ``--max-document-bytes`` (64 MiB): refused, naming the file; peak should not grow with
  the bomb;
* **near_limit**: one ``.jsonl`` line of ``--near-mb`` (60 MB by default), under the limit, byte
  tokenizer, ``--workers 2``: the cost of the longest document the limit lets through;
* **long_bpe**: one line of ``--bpe-mb`` (16 MB) of words, with a byte-level BPE (GPT-2's
  pre-tokenizer, 1,000 ids, trained by ``tests/ingest_support.train_bpe`` into ``--workdir``):
  a tokenizer holds far more per token than bytes, so this is the per-document cost that counts.

``--code`` runs the same cases with another checkout's ``speedtronic`` (e.g. main before the
fix: the bomb is read whole there). Prints a table (peak MB, ratio to **normal**, wall time,
exit code) and one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
PROBE = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.stderr.write(r.stderr[-400:])\n"
)


def bomb(path: Path, megabytes: int) -> Path:
    if not path.exists():
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = b"a" * (1 << 20)
        with open(path, "wb") as f:
            f.write(packer.compress(b'{"text": "'))
            for _ in range(megabytes):
                f.write(packer.compress(block))
            f.write(packer.flush())
    return path


def normal(path: Path, megabytes: int) -> Path:
    if not path.exists():
        rng = random.Random(0)
        words = "the cat sat on a mat while two dogs ran past the old red barn at noon".split()
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
            written = 0
            while written < megabytes << 20:
                line = json.dumps({"text": " ".join(rng.choices(words, k=400))}) + "\n"
                f.write(line)
                written += len(line)
    return path


def near_limit(path: Path, megabytes: int) -> Path:
    if not path.exists():
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"text": "short"}\n{"text": "' + "b" * (megabytes << 20) + '"}\n')
    return path


def long_words(path: Path, megabytes: int) -> Path:
    if not path.exists():
        rng = random.Random(0)
        words = "the cat sat on a mat while two dogs ran past the old red barn at noon".split()
        text = " ".join(rng.choices(words, k=(megabytes << 20) // 3))[: megabytes << 20]
        path.write_text('{"text": "short"}\n{"text": "' + text + '"}\n', encoding="utf-8")
    return path


def measure(name: str, args: list[str], code: Path, workdir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
    )
    wall = time.monotonic() - started
    code_, peak_kib = (int(v) for v in done.stdout.split())
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return {"case": name, "peak_mb": peak_kib / 1024, "wall_s": wall, "exit": code_, "last": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/speedtronic-tokenize-memory"))
    parser.add_argument("--bomb-mb", type=int, default=1024)
    parser.add_argument("--normal-mb", type=int, default=64)
    parser.add_argument("--near-mb", type=int, default=60)
    parser.add_argument("--bpe-mb", type=int, default=16)
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    files = {
        "normal": normal(work / f"normal_{args.normal_mb}.jsonl.gz", args.normal_mb),
        "bomb": bomb(work / f"bomb_{args.bomb_mb}.jsonl.gz", args.bomb_mb),
        "near_limit": near_limit(work / f"near_{args.near_mb}.jsonl", args.near_mb),
        "long_bpe": long_words(work / f"words_{args.bpe_mb}.jsonl", args.bpe_mb),
    }
    bpe = work / "bpe_1000.json"
    if not bpe.exists():
        from ingest_support import train_bpe

        train_bpe(bpe, vocab_size=1000)
    tokenize = ["-m", "speedtronic", "data", "tokenize"]
    cases = [("imports", ["-c", "import speedtronic.data.ingest.pipeline"])]
    for name, path in files.items():
        out = work / f"out_{name}"
        subprocess.run(["rm", "-rf", str(out), f"{out}.partial"], check=True)
        extra = ["--tokenizer", str(bpe)] if name == "long_bpe" else []
        cases.append((name, [*tokenize, str(path), str(out), "--workers", "2", *extra]))
    rows = [measure(name, case, args.code, work) for name, case in cases]
    base = next(r["peak_mb"] for r in rows if r["case"] == "normal")
    sizes = {name: path.stat().st_size for name, path in files.items()}
    print(f"code: {args.code}; bomb {sizes['bomb']:,} bytes on disk -> {args.bomb_mb} MiB")
    print(f"{'case':<12}{'peak MB':>10}{'/ normal':>10}{'wall s':>9}{'exit':>6}  last line")
    for r in rows:
        ratio = r["peak_mb"] / base
        print(
            f"{r['case']:<12}{r['peak_mb']:>10,.0f}{ratio:>10.2f}{r['wall_s']:>9.1f}"
            f"{r['exit']:>6}  {r['last'][:90]}"
        )
    print(json.dumps({"code": str(args.code), "bomb_mb": args.bomb_mb, "rows": rows}))


if __name__ == "__main__":
    main()

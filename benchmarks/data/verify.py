"""What verifying a token folder costs at start (issue 35): sha256 GB/s against a plain read.

Usage::

    python benchmarks/data/verify.py                 # 4 shards of 64 MiB, 3 rounds (~1 min)
    python benchmarks/data/verify.py --mb 32 --shards 2 --rounds 2

A folder of ``--shards`` shards of ``--mb`` MiB of random uint16 ids (and a manifest, written
like ``data tokenize``'s: sizes and sha256s) is made under a temporary directory. Every case
reads the same bytes, from the page cache (each file is read once untimed first), so the figures
are the CPU's, not a disk's:

* ``plain read``: the baseline, the same 4 MiB ``readinto`` loop without hashing, 1 thread;
* ``sha256, 1 thread``: ``data.integrity.sha256_file`` over every shard on the calling thread;
* ``sha256, threads``: ``data.integrity.hash_files`` (the path training takes: min(4, cores)
  helper threads, one file each);
* ``verify_folder, first``: the whole check (manifest read, stat, hash, the verdict written);
* ``verify_folder, cached``: the second start (stat and the verdict file only).

Each case's median over ``--rounds``; GB/s = bytes / seconds (10**9 bytes a GB). The start-up
of a 10 GB folder is estimated as 10 GB / the threaded GB/s (a cold disk slower than that is
the bound instead: a first start reads the folder once either way, and the token-id check at
start reads the train part again). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from speedtronic.data import integrity  # noqa: E402
from speedtronic.data.manifest import FORMAT, VERSION, read_manifest  # noqa: E402


def make_folder(root: Path, shards: int, mb: int) -> Path:
    """A token folder of random ids with a manifest that tells their truth."""
    folder = root / "tokens"
    folder.mkdir()
    records = []
    for i in range(shards):
        data = os.urandom(mb << 20)
        (folder / f"train_{i:05d}.bin").write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        records.append({"file": f"train_{i:05d}.bin", "tokens": len(data) // 2, "sha256": digest})
    manifest = {"format": FORMAT, "version": VERSION, "dtype": "uint16", "vocab_size": 65536}
    manifest.update(tokenizer={"kind": "byte"}, parts={"train": records})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def plain_read(paths: list[Path]) -> None:
    buffer = bytearray(integrity.CHUNK)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def timed(fn, rounds: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (this process, all its threads)."""
    times, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), statistics.median(cpu)


def cases(folder: Path, paths: list[Path]) -> dict:
    doc = read_manifest(folder, "bench")

    def first():
        (folder / integrity.CACHE_FILE).unlink(missing_ok=True)
        integrity.verify_folder(folder, doc, "bench")

    return {
        "plain read": lambda: plain_read(paths),
        "sha256, 1 thread": lambda: [integrity.sha256_file(p) for p in paths],
        "sha256, threads": lambda: integrity.hash_files(paths),
        "verify_folder, first": first,
        "verify_folder, cached": lambda: integrity.verify_folder(folder, doc, "bench"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="MiB per shard")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_folder(Path(tmp), args.shards, args.mb)
        paths = sorted(folder.glob("train_*.bin"))
        size = sum(p.stat().st_size for p in paths)
        plain_read(paths)  # into the page cache: every case reads the same cached bytes
        measured = {name: timed(fn, args.rounds) for name, fn in cases(folder, paths).items()}
    load = os.getloadavg()[0]
    threads = min(integrity.MAX_THREADS, os.cpu_count() or 1)
    print(f"{size / 1e9:.3f} GB in {args.shards} shards, {threads} hash threads, load {load:.1f}")
    print("| case | seconds | CPU s | GB/s | GB per CPU s | time / plain read |")
    print("|---|---|---|---|---|---|")
    base = measured["plain read"][0]
    for name, (s, cpu) in measured.items():
        per_cpu = f"{size / cpu / 1e9:.2f}" if cpu > 0.001 else "-"
        print(
            f"| {name} | {s:.4f} | {cpu:.3f} | {size / s / 1e9:.2f} | {per_cpu} | {s / base:.2f} |"
        )
    rate = size / measured["sha256, threads"][0] / 1e9
    core = size / measured["sha256, 1 thread"][1] / 1e9
    print(
        f"estimated first start of a 10 GB folder: {10 / rate:.1f} s here (hashing at "
        f"{rate:.2f} GB/s); {10 / core / threads:.1f} s on {threads} idle cores ({core:.2f} GB "
        "per CPU second)"
    )
    result = {"bytes": size, "threads": threads, "load": load, "seconds": measured}
    result.update(hash_gb_per_s=rate, hash_gb_per_cpu_s=core, estimated_10gb_s=10 / rate)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

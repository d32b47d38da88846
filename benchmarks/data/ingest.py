"""Ingest benchmark: ``speedtronic data tokenize`` against a plain pyarrow + encode_batch loop.

Usage::

    python benchmarks/data/ingest.py                  # ~16 MB of text, 3 rounds (~4 min on 2 cores)
    python benchmarks/data/ingest.py --quick          # ~4 MB, 2 rounds (~1 min)
    python benchmarks/data/ingest.py --mb 64 --rounds 5 --check

The corpus is the Python standard library's sources cut into documents of about 4,000
characters at blank lines, written as FineWeb-shaped Parquet shards (the ten FineWeb-Edu columns,
``text`` among them; 4 MB files, row groups of 256 documents) under ``--workdir``. GPT-2's
``tokenizer.json`` cannot be downloaded here, so the tokenizer is a byte-level BPE with GPT-2's
pre-tokenizer and ``<|endoftext|>``, trained with ``tokenizers`` on the first 4 MB of that corpus
(``--vocab`` ids, 16,384 by default); both are kept in ``--workdir`` for the next run.

Each measurement is a fresh child process pinned (``sched_setaffinity``) to 1 core, then to all
the cores this process may use, timed from after its imports to the last byte written (the pool's
start-up included):

* **plain**: for each file and row group, ``read_row_group(columns=["text"]).to_pylist()``,
  ``Tokenizer.encode_batch(texts)`` (its own Rayon threads: ``RAYON_NUM_THREADS`` = the cores),
  ``<|endoftext|>`` before each document's ids, ``np.array(..., uint16).tofile`` (the loop of
  llm.c's ``fineweb.py`` and nanoGPT's ``prepare.py``, without their process pools);
* **ours**: ``tokenize_corpus`` (the command's engine) with ``--workers`` = the cores, writing
  its shard folder, manifest, journal and sha256s;
* **plain_fast** (1 core only): the plain loop with ``encode_batch_fast`` (the same ids without
  offsets, which ours uses), to show what is left of the difference once the call is the same.

Both write the same token ids (checked: equal sha256 of the token bytes, or the run fails).
Rounds alternate the cases; the median of each is reported with documents/s, tokens/s, each
side's time over ours (above 1: ours is faster) and each side's scaling (all cores / 1 core).
The load average is printed beside the figures: the cores are shared, so each case's CPU time is
printed too (its process and the workers it waited for, imports included): CPU time that does not
grow from 1 core to all means the parallel run adds no work, and only contention keeps it from
scaling. Target: ours >= 0.9x plain's speed on 1 core; ``--check`` exits 1 when missed. One
JSON line at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))
TARGET_ONE_CORE = 0.9
SIDES = ("plain", "ours", "plain_fast")  # plain_fast: 1 core only
FILE_BYTES = 4 << 20
ROW_GROUP = 256


# ---- the corpus and the tokenizer ----------------------------------------------------------


def stdlib_documents(limit_bytes: int) -> list[str]:
    docs, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        piece = ""
        for para in text.split("\n\n"):
            piece += para + "\n\n"
            if len(piece) >= 4000:
                docs.append(piece)
                size += len(piece)
                piece = ""
        if piece.strip():
            docs.append(piece)
            size += len(piece)
        if size >= limit_bytes:
            break
    return docs


def make_corpus(workdir: Path, mb: int, vocab: int) -> tuple[Path, Path, dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ingest_support import fineweb_rows, train_bpe

    corpus = workdir / f"corpus_{mb}mb"
    docs = stdlib_documents(mb << 20)
    if not corpus.is_dir():
        corpus.mkdir(parents=True)
        batch, size, index = [], 0, 0
        for doc in docs + [None]:
            if doc is not None:
                batch.append(doc)
                size += len(doc)
            if batch and (doc is None or size >= FILE_BYTES):
                table = pa.table(fineweb_rows(batch))
                pq.write_table(
                    table, corpus / f"{index:03d}_00000.parquet", row_group_size=ROW_GROUP
                )
                batch, size, index = [], 0, index + 1
    tokenizer = workdir / f"bpe_{vocab}.json"
    if not tokenizer.is_file():
        train_bpe(tokenizer, vocab_size=vocab, corpus_bytes=4 << 20)
    facts = {
        "documents": len(docs),
        "text_bytes": sum(len(d.encode()) for d in docs),
        "parquet_bytes": sum(p.stat().st_size for p in corpus.glob("*.parquet")),
        "files": len(list(corpus.glob("*.parquet"))),
    }
    return corpus, tokenizer, facts


# ---- the two sides, each in its own pinned process -------------------------------------------


def plain(corpus: Path, tokenizer: Path, out: Path, fast: bool = False) -> dict:
    import numpy as np
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    eot = tok.token_to_id("<|endoftext|>")
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    start = time.perf_counter()
    documents = tokens = 0
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for path in sorted(corpus.glob("*.parquet")):
            pf = pq.ParquetFile(path)
            for g in range(pf.num_row_groups):
                texts = pf.read_row_group(g, columns=["text"]).column(0).to_pylist()
                ids: list[int] = []
                for enc in encode(texts, add_special_tokens=False):
                    ids.append(eot)
                    ids.extend(enc.ids)
                data = np.array(ids, dtype=np.uint16).tobytes()
                f.write(data)
                digest.update(data)
                documents, tokens = documents + len(texts), tokens + len(ids)
    return {"elapsed_s": time.perf_counter() - start, "documents": documents, "tokens": tokens,
            "sha256": digest.hexdigest()}  # fmt: skip


def ours(corpus: Path, tokenizer: Path, out: Path, workers: int) -> dict:
    import shutil

    from speedtronic.data.ingest.pipeline import tokenize_corpus
    from speedtronic.data.ingest.plan import Request

    shutil.rmtree(out, ignore_errors=True)
    start, own = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    report = tokenize_corpus(Request((str(corpus),), str(tokenizer)), out, workers=workers)
    elapsed = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_SELF)  # the main process alone, not its workers
    main_cpu = now.ru_utime - own.ru_utime + now.ru_stime - own.ru_stime
    digest = hashlib.sha256()
    for shard in report["shards"]["train"]:
        digest.update((out / shard["file"]).read_bytes())
    return {"elapsed_s": elapsed, "documents": report["documents"], "tokens": report["tokens"],
            "sha256": digest.hexdigest(), "main_cpu_s": main_cpu}  # fmt: skip


def child(args) -> None:
    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    os.sched_setaffinity(0, cores)
    os.environ["RAYON_NUM_THREADS"] = str(args.cores)  # before tokenizers starts its pool
    corpus, tokenizer, out = Path(args.corpus), Path(args.tokenizer), Path(args.out)
    if args.side in ("plain", "plain_fast"):
        result = plain(corpus, tokenizer, out, fast=args.side == "plain_fast")
    else:
        result = ours(corpus, tokenizer, out, args.cores)
    print(json.dumps(result))


def measure(side: str, cores: int, corpus: Path, tokenizer: Path, workdir: Path) -> dict:
    out = workdir / f"out_{side}_{cores}"
    cmd = [sys.executable, __file__, "--child", side, "--cores", str(cores), "--corpus",
           str(corpus), "--tokenizer", str(tokenizer), "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{side} on {cores} core(s) failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # CPU of the child and of every process it waited for (the pool's workers), imports included
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**result, "cpu_s": cpu}


# ---- the run -------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=16, help="MB of text in the corpus")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--workdir", default="/tmp/speedtronic_ingest_bench")
    parser.add_argument("--quick", action="store_true", help="4 MB, 2 rounds")
    parser.add_argument("--check", action="store_true", help="exit 1 below the 1-core target")
    parser.add_argument("--child", dest="side", help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        child(args)
        return 0
    if args.quick:
        args.mb, args.rounds = 4, 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer, facts = make_corpus(workdir, args.mb, args.vocab)
    all_cores = len(os.sched_getaffinity(0))
    counts = sorted({1, all_cores})
    load_before = os.getloadavg()
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for cores in counts:
            for side in SIDES if cores == 1 else ("plain", "ours"):
                runs.setdefault((side, cores), []).append(
                    measure(side, cores, corpus, tokenizer, workdir)
                )
    load_after = os.getloadavg()
    hashes = {r["sha256"] for rs in runs.values() for r in rs}
    if len(hashes) != 1:
        raise SystemExit(f"the two sides wrote different tokens: {len(hashes)} distinct hashes")
    return report(runs, counts, facts, load_before, load_after, args)


def report(runs, counts, facts, load_before, load_after, args) -> int:
    med = {k: statistics.median(r["elapsed_s"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    first = next(iter(runs.values()))[0]
    docs, tokens = first["documents"], first["tokens"]
    print(f"corpus: {facts['files']} Parquet files, {facts['parquet_bytes'] / 1e6:.1f} MB "
          f"({facts['text_bytes'] / 1e6:.1f} MB of text), {docs:,} documents, {tokens:,} tokens; "
          f"BPE vocab {args.vocab}; {args.rounds} rounds, medians")  # fmt: skip
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({len(os.sched_getaffinity(0))} cores)")  # fmt: skip
    head = f"{'cores':>5} {'side':>10} {'seconds':>8} {'cpu s':>7} {'docs/s':>9} {'tokens/s':>11}"
    print(f"{head} {'time/ours':>9}")
    result = {"documents": docs, "tokens": tokens, "rounds": args.rounds, "vocab_size": args.vocab,
              "load_before": load_before[0], "load_after": load_after[0], "cases": {}}  # fmt: skip
    for cores in counts:
        for side in [side for side in SIDES if (side, cores) in med]:
            s, c = med[(side, cores)], cpu[(side, cores)]
            shown = f"{s / med[('ours', cores)]:.2f}" if side != "ours" else ""
            line = f"{cores:>5} {side:>10} {s:8.2f} {c:7.2f} {docs / s:9,.0f} {tokens / s:11,.0f}"
            print(f"{line} {shown:>9}")
            result["cases"][f"{side}_{cores}"] = {
                "elapsed_s": round(s, 3),
                "cpu_s": round(c, 3),
                "documents_per_s": round(docs / s, 1),
                "tokens_per_s": round(tokens / s, 1),
            }
        result["cases"][f"ratio_{cores}"] = round(med[("plain", cores)] / med[("ours", cores)], 3)
    result["cases"]["ratio_fast_1"] = round(med[("plain_fast", 1)] / med[("ours", 1)], 3)
    if len(counts) > 1:
        for side in ("plain", "ours"):
            scale = med[(side, 1)] / med[(side, counts[-1])]
            work = cpu[(side, counts[-1])] / cpu[(side, 1)]
            result["cases"][f"scaling_{side}"] = round(scale, 3)
            result["cases"][f"cpu_growth_{side}"] = round(work, 3)
            print(f"{side} scaling 1 -> {counts[-1]} cores: {scale:.2f}x wall; CPU time "
                  f"x{work:.2f} (1.00: no work added by parallelism)")  # fmt: skip
        main = statistics.median(r["main_cpu_s"] for r in runs[("ours", counts[-1])])
        result["cases"][f"ours_{counts[-1]}"]["main_cpu_s"] = round(main, 3)
        share = main / cpu[("ours", counts[-1])]
        print(f"ours on {counts[-1]} cores: the main process (metadata, writes, commits) spent "
              f"{main:.2f} CPU s, {share:.1%} of the job")  # fmt: skip
    one = result["cases"]["ratio_1"]
    verdict = "ok" if one >= TARGET_ONE_CORE else "MISSED"
    print(f"target: ours >= {TARGET_ONE_CORE}x plain on 1 core: {one:.2f} {verdict}")
    print(json.dumps({"benchmark": "ingest", **result}))
    return 1 if args.check and one < TARGET_ONE_CORE else 0


if __name__ == "__main__":
    sys.exit(main())

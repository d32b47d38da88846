"""Data benchmark: loader throughput against training's appetite, and RSS while streaming text.

Usage::

    python benchmarks/data/stream.py                    # full run, ~2-3 min on 2 CPU cores
    python benchmarks/data/stream.py --quick  # ~1 min: shorter timings, 100 MB / 1 GB files
    python benchmarks/data/stream.py --sizes 200m,2g --seconds 4 --keep --check

Part 1, throughput. The corpus is the Python standard library's ``.py`` sources concatenated
(~30 MB, valid UTF-8 only); the token file is that corpus written by
``speedtronic.data.sources.tokenize_file`` with the byte tokenizer as ``uint16``. Each source is
read through ``build_dataloader(config)`` wrapped in ``DataStream`` (the trainer's path), with
the ~10M-parameter config of ``benchmarks/engine/overhead.py`` (``TEN_M``: seq_len 256,
micro-batch 4, shuffle on) and ``num_workers`` 0 and 2: ``--warmup-batches`` untimed, then
batches for ``--seconds``; tokens/s counts ``input_ids``. The consumption rate is measured in
the same run: tokens per step / the median time of ``--train-steps`` optimizer steps of that
~10M model on the text source through ``build_runtime(config).trainer.train_step()``
(CheckpointPlugin detached, ``--train-warmup`` steps untimed; its CPU share exposes a busy
machine). Headroom = loader tokens/s / training tokens/s; targets: >= 20x token files, >= 5x
text.

Part 2, memory. Text files of ``--sizes`` (stdlib corpus repeated, exact size, valid UTF-8) are
made under ``--workdir`` (kept if already there with the right size, deleted at the end unless
``--keep``). Each measurement runs in a fresh child process, which records its peak RSS
(``ru_maxrss``) after imports as the baseline and reports the growth above it, reading the
byte-level text source with ``num_workers`` 0:

* shuffled: ``--rss-batches`` batches of the TEN_M shape, shuffle on (random blocks across the
  whole file, after the sampler has drawn its epoch order);
* sequential: shuffle off, blocks of ``--seq-block`` bytes, the first ``--seq-fraction`` of
  the file.

Target: growth under 200 MB for every size (flat in the file size). ``--check`` exits 1 when a
target is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # overhead.py: TEN_M
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from overhead import TEN_M  # noqa: E402

from speedtronic.config import SpeedtronicConfig  # noqa: E402
from speedtronic.data import DataStream, build_dataloader  # noqa: E402
from speedtronic.data.sources import tokenize_file  # noqa: E402
from speedtronic.data.tokenizer import ByteTokenizer  # noqa: E402
from speedtronic.runtime import build_runtime, count_parameters  # noqa: E402

HEADROOM_TARGETS = {"tokens": 20.0, "text": 5.0}
RSS_TARGET_MB = 200.0
MB = 10**6


# ---- corpora -----------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """``200m`` / ``2g`` / ``1.5g`` / ``123456`` -> bytes (decimal units)."""
    text = text.strip().lower()
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:], 1)
    return int(float(text.rstrip("kmg")) * scale)


def stdlib_corpus() -> bytes:
    """Every stdlib ``.py`` file (no site-packages) that is valid UTF-8, sorted, concatenated."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "site-packages":
            continue
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:  # a few test files are deliberately not UTF-8
            continue
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    return b"".join(parts)


def write_text(path: Path, size: int, base: bytes) -> bool:
    """``base`` repeated to exactly ``size`` bytes (the last copy cut after a newline and padded
    with newlines, so the file stays valid UTF-8). Returns False if it already existed."""
    if path.exists() and path.stat().st_size == size:
        return False
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        left = size
        while left > 0:
            if len(base) <= left:
                chunk = base
            else:
                cut = base.rfind(b"\n", 0, left) + 1
                chunk = base[:cut] + b"\n" * (left - cut)
            f.write(chunk)
            left -= len(chunk)
    os.replace(tmp, path)
    return True


# ---- configs -----------------------------------------------------------------------------


def ten_m_config(output_dir: str, max_steps: int = 10, **data: Any) -> SpeedtronicConfig:
    """The packaged smoke config with overhead.py's TEN_M sizes, plus ``data`` settings."""
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    for section, values in TEN_M.items():
        raw[section].update(values)
    raw["run"].update(name="data-bench", max_steps=max_steps, output_dir=output_dir)
    raw["logging"].update(file=None, json_file=None, hooks=[])
    raw["checkpoint"]["interval"] = 0
    raw["data"].update(data)
    return SpeedtronicConfig.from_dict(raw)


# ---- part 1: throughput ------------------------------------------------------------------


def training_rate(text_path: Path, scratch: str, warmup: int, steps: int) -> dict[str, Any]:
    """Tokens/s of the ~10M model on the text source: the median of ``steps`` timed steps."""
    config = ten_m_config(scratch, max_steps=warmup + steps, text_path=str(text_path))
    runtime = build_runtime(config, console=False)
    trainer = runtime.trainer
    if runtime.checkpoints in trainer.plugins:
        trainer.plugins.remove(runtime.checkpoints)
    walls, cpus = [], []
    try:
        for _ in range(warmup):
            trainer.train_step()
        for _ in range(steps):
            wall, cpu = time.perf_counter(), time.process_time()
            loss, _ = trainer.train_step()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    finally:
        runtime.logger.close()
    return {
        "params": count_parameters(runtime.model),
        "precision": runtime.precision.mode,
        "tokens_per_step": config.tokens_per_step,
        "steps": steps,
        "step_seconds": walls,
        "tokens_per_s": config.tokens_per_step / statistics.median(walls),
        # CPU time / (wall * threads): well under 1 means another process had the cores
        "cpu_share": sum(cpus) / (sum(walls) * torch.get_num_threads()),
        "loss": float(loss),
    }


def loader_rate(config: SpeedtronicConfig, seconds: float, warmup: int) -> dict[str, Any]:
    """Tokens/s delivered in ``input_ids`` by ``DataStream(build_dataloader(config))``."""
    stream = DataStream(build_dataloader(config), log=lambda _: None)
    for _ in range(warmup):  # includes starting the workers
        next(stream)
    tokens = batches = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        tokens += next(stream)["input_ids"].numel()
        batches += 1
        elapsed = time.perf_counter() - start
    del stream  # shuts the persistent workers down
    gc.collect()
    return {"batches": batches, "seconds": elapsed, "tokens_per_s": tokens / elapsed}


def throughput(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], list[dict]]:
    corpus, tokens = work / "corpus.txt", work / "corpus.u16"
    write_text(corpus, len(args.base), args.base)
    if not tokens.exists():
        tokenize_file(corpus, tokens, ByteTokenizer(), dtype="uint16")
    with tempfile.TemporaryDirectory(prefix="speedtronic-data-bench-") as scratch:
        train = training_rate(corpus, scratch, args.train_warmup, args.train_steps)
        print(f"  training: {train['tokens_per_s']:,.0f} tok/s", file=sys.stderr, flush=True)
        rows = []
        for source, key in (("tokens", "token_path"), ("text", "text_path")):
            path = tokens if source == "tokens" else corpus
            extra = {"token_dtype": "uint16"} if source == "tokens" else {}
            for workers in args.workers:
                config = ten_m_config(scratch, **{key: str(path)}, num_workers=workers, **extra)
                rate = loader_rate(config, args.seconds, args.warmup_batches)
                headroom = rate["tokens_per_s"] / train["tokens_per_s"]
                target = HEADROOM_TARGETS[source]
                rows.append(
                    {"source": source, "num_workers": workers, **rate, "headroom": headroom}
                    | {"target": target, "ok": headroom >= target}
                )
                line = f"  {source} w={workers}: {rate['tokens_per_s']:,.0f} tok/s"
                print(line, file=sys.stderr, flush=True)
    train |= {"corpus_bytes": corpus.stat().st_size}
    return train, rows


# ---- part 2: memory ----------------------------------------------------------------------


def rss_mib() -> tuple[float, float]:
    """(current, peak) RSS of this process in MiB: /proc/self/status, else ru_maxrss twice."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # not Linux: ru_maxrss is KiB, on macOS bytes
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak /= 1 << 20 if sys.platform == "darwin" else 1 << 10
        return peak, peak
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak_rss() -> None:
    """Start the peak (VmHWM) afresh, so a transient peak of the imports hides no growth."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the baseline is then the peak so far


def rss_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh process: stream the text file as ``spec`` says, report RSS growth."""
    reset_peak_rss()
    current, peak = rss_mib()
    baseline = current if current == peak else peak
    size = Path(spec["path"]).stat().st_size
    with tempfile.TemporaryDirectory(prefix="speedtronic-data-rss-") as scratch:
        if spec["mode"] == "shuffled":
            config = ten_m_config(scratch, text_path=spec["path"], shuffle=True)
            batches = spec["batches"]
        else:
            seq, micro = spec["seq_block"], 16
            shape = {"seq_len": seq, "micro_batch_size": micro, "target_batch_size": micro}
            config = ten_m_config(scratch, text_path=spec["path"], shuffle=False, **shape)
            batches = max(1, int(size * spec["fraction"]) // (seq * micro))
        stream = DataStream(build_dataloader(config), log=lambda _: None)
        start, read = time.perf_counter(), next(stream)["input_ids"].numel()
        first = rss_mib()[1]  # the epoch has started: the sampler has drawn its order
        for _ in range(batches - 1):
            read += next(stream)["input_ids"].numel()
        seconds = time.perf_counter() - start
    peak = rss_mib()[1]
    return {
        "baseline_mb": baseline,
        "peak_mb": peak,
        "growth_mb": peak - baseline,
        "first_batch_growth_mb": first - baseline,
        "batches": batches,
        "bytes_read": read,
        "seconds": seconds,
    }


def measure_rss(path: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = {
        "path": str(path),
        "mode": mode,
        "batches": args.rss_batches,
        "seq_block": args.seq_block,
        "fraction": args.seq_fraction,
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"RSS child failed ({mode}, {path}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    for size in args.sizes:
        path = work / f"text-{size}.txt"
        start = time.perf_counter()
        made = write_text(path, size, args.base)
        note = f"made in {time.perf_counter() - start:.1f} s" if made else "reused"
        print(f"  {path} ({size / MB:,.0f} MB): {note}", file=sys.stderr, flush=True)
        for mode in ("shuffled", "sequential"):
            result = measure_rss(path, mode, args)
            ok = result["growth_mb"] < RSS_TARGET_MB
            rows.append({"size_mb": size / MB, "mode": mode, **result, "ok": ok})
            print(f"  {mode}: +{result['growth_mb']:.1f} MiB", file=sys.stderr, flush=True)
    return rows


# ---- report ------------------------------------------------------------------------------


def print_tables(train: dict[str, Any], loaders: list[dict], rss: list[dict]) -> None:
    if train:
        print(
            f"training (~{train['params'] / 1e6:.1f}M params, {train['precision']}, "
            f"{train['tokens_per_step']} tok/step): {train['tokens_per_s']:,.0f} tok/s "
            f"(median of {train['steps']} steps, {sum(train['step_seconds']):.1f} s, "
            f"cpu share {train['cpu_share']:.0%})\n"
        )
        head = f"{'source':<8}{'workers':>8}{'batches':>9}{'loader tok/s':>15}{'headroom':>11}"
        print(head + f"{'target':>9}  ok\n" + "-" * (len(head) + 13))
        for r in loaders:
            print(
                f"{r['source']:<8}{r['num_workers']:>8}{r['batches']:>9,}"
                f"{r['tokens_per_s']:>15,.0f}{r['headroom']:>10,.0f}x{r['target']:>8.0f}x"
                f"  {'yes' if r['ok'] else 'NO'}"
            )
        print()
    if rss:
        head = f"{'file MB':>8}  {'mode':<11}{'batches':>9}{'MB read':>9}{'s':>7}"
        head += f"{'base MiB':>10}{'peak MiB':>10}{'1st-batch MiB':>15}{'growth MiB':>12}"
        print(head + "  ok\n" + "-" * (len(head) + 4))
        for r in rss:
            print(
                f"{r['size_mb']:>8,.0f}  {r['mode']:<11}{r['batches']:>9,}"
                f"{r['bytes_read'] / MB:>9,.1f}{r['seconds']:>7.1f}{r['baseline_mb']:>10.1f}"
                f"{r['peak_mb']:>10.1f}{r['first_batch_growth_mb']:>15.1f}{r['growth_mb']:>12.1f}"
                f"  {'yes' if r['ok'] else 'NO'}"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="short timings and 100 MB / 1 GB files (~1 min)")
    add("--sizes", help="text file sizes for the RSS part (default 200m,2g; quick 100m,1g)")
    add("--seconds", type=float, help="timed seconds per loader (default 4, quick 1.5)")
    add("--warmup-batches", type=int, default=20, help="untimed batches per loader")
    add("--workers", type=int, nargs="+", default=[0, 2], help="num_workers values")
    add("--train-steps", type=int, help="timed optimizer steps (default 5, quick 3)")
    add("--train-warmup", type=int, default=1, help="untimed optimizer steps")
    add("--rss-batches", type=int, default=2000, help="shuffled batches per RSS child")
    add("--seq-block", type=int, default=8192, help="block bytes of the sequential pass")
    add("--seq-fraction", type=float, help="share of the file read in order (default 1; q 0.25)")
    add("--skip", choices=["throughput", "memory"], help="leave one part out")
    add("--workdir", default="/tmp/speedtronic-data-bench", help="where the corpora are made")
    add("--keep", action="store_true", help="keep the generated files")
    add("--check", action="store_true", help="exit 1 when a target is missed")
    add("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    sizes = args.sizes or ("100m,1g" if quick else "200m,2g")
    args.sizes = [parse_size(s) for s in sizes.split(",")]
    args.seconds = args.seconds or (1.5 if quick else 4.0)
    args.train_steps = args.train_steps or (3 if quick else 5)
    args.seq_fraction = args.seq_fraction or (0.25 if quick else 1.0)
    if not 0 < args.seq_fraction <= 1 or min(args.sizes) < 1 << 20:
        parser.error("--seq-fraction must be in (0, 1]; --sizes at least 1m each")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(rss_child(json.loads(args.child))))
        return 0
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    args.base = stdlib_corpus()
    train, loaders, rss = {}, [], []
    try:
        if args.skip != "throughput":
            train, loaders = throughput(args, work)
        if args.skip != "memory":
            rss = memory(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_tables(train, loaders, rss)
    rows = loaders + rss
    summary = {"benchmark": "data", "training": train, "loaders": loaders, "rss": rss}
    summary |= {"ok": all(r["ok"] for r in rows), "wall_s": time.perf_counter() - start}
    print(json.dumps(summary))
    return 1 if args.check and not summary["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())

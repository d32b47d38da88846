"""DumbDiLoCo convergence at equal wall-clock, with latency: is 4 machines' model better than 1's?

Usage::

    python benchmarks/diloco/convergence.py --quick                       # ~1 min smoke run
    python benchmarks/diloco/convergence.py --arms main --jobs 2 --out main.json
    python benchmarks/diloco/convergence.py --arms a,c_f0.25_eager_keep --seeds 0
    python benchmarks/diloco/convergence.py --arms long --steps 2400 --jobs 2 --out long.json
    python benchmarks/diloco/convergence.py --merge main.json more.json --out all.json \\
        --long long.json --png docs/diloco_convergence.png              # tables + plot again

Every arm trains the same ~0.43M-parameter ``reference_transformer`` on byte-level Python
stdlib source from the same initial weights per seed, and is scored by the held-out eval loss
of the **published global weights** (arm ``a``: the one worker's weights), read back from the
repo and validated. How the nodes run, and the latency model, are in ``sim.py``: the
product's ``WorkerPlugin`` and ``MasterLoop`` on a simulated clock, where uploads, publishes,
downloads and polls take fractions ``f`` of one inner loop L (``Latency``).

**Equal wall-clock.** Every arm stops at the same simulated time T = ``--steps`` x 0.3 s, one
worker's run: arms that wait (``sync``) train fewer steps in it (their cosine schedule is
fitted to the steps they can do, measured by a dry run of the same event loop). Then the flush:
uploads in flight land and the master's final round publishes; that global's loss is the score
("final"). Also reported: when an arm's published global first reaches arm ``a``'s final loss
(same seed), as a fraction of T ("flush" if only the flushed global does). **Equal tokens**
(``_tok``): each worker trains ``--steps`` steps however long that takes; the asynchronous arms
never wait, so for them both budgets are the same run.

Arm names: ``a`` (one worker, ``--steps`` steps), or ``c`` (4 equal workers) / ``d`` (4 uneven
workers, speeds ``--speeds`` 1 : 1.3 : 2.6 : 5.7 scaled to a mean of 1, so the fleet has the
same compute as ``c``) with ``_``-separated modifiers: ``f<x>`` latency fraction; ``eager``
(``install: eager``; default ``boundary``); ``sync`` (blocking synchronous DiLoCo:
``sync_wait_s`` and ``min_deltas`` = nodes); ``keep`` (``reset_inner_optimizer: false``);
``bare`` (``reapply_own_delta: false``); ``tok`` (equal tokens); ``dylu`` (dynamic local
updates, Liu et al. 2024: each node's ``inner_steps`` scaled by its speed, so every node's loop
takes L); ``naive`` (outer policy); ``lr<x>``, ``m<x>``, ``md<n>``, ``sd<x>``, ``ms<n>`` (outer
lr, momentum, min_deltas, staleness discount, max_staleness); ``muon`` (Muon as the inner
optimizer, ``sim.MUON_INNER``; also ``a_muon``), whose steps cost ``MUON_STEP_COST`` times an
AdamW step (measured by ``--muon-cost``), so fewer fit in T, ``cost<x>`` to set it; an encoding
(``fp32``, ``bf16``, ``int8``, ``int4``, ``int2``: ``distributed.delta_dtype``), ``noef``
(``error_feedback: false``) and ``bw`` (issue 38: uploads, downloads and publishes cost bytes
over a cable-like link, ``sim.link_latency``, on which a bf16 delta takes f x L), ``gint8`` /
``gint4`` (``distributed.global_dtype``: the global as an update on a keyframe, each publish and
download charged by its bytes), ``gdeltas`` (issue 54: no global published; each node downloads
the round's other deltas and applies it, exact; ``sim.py``'s docstring) and ``kf<n>``
(``keyframe_every``); ``h<n>`` (this arm's H; the link stays the one calibrated on the scale's
H), ``jit<x>`` (every step's time times a log-normal factor of mean 1 and spread x),
``stall<p>`` (after each inner loop, with chance p, the machine pauses for one loop: another
job, a sleeping laptop), ``ljit<x>`` (every transfer's time times such a factor), ``mx`` (the
master on a fifth machine instead of worker 0's), ``s<n>`` (this arm's T, in AdamW steps) and,
for arm a only, ``b<n>`` (its batch at the same step time: data parallel over 4 machines with a
free all-reduce is ``a_muon_b32``). Everything else is the product's default: plain averaging
(outer lr 1.0, momentum 0), fleet policy, min_deltas 2, bf16 deltas. ``c_f0.25`` is the old
default (boundary installs, AdamW reset).

Presets for ``--arms`` (see ``PRESETS``): ``main`` (the latency grid), ``tokens``, ``uneven``,
``corrections``, ``long`` (run it with ``--steps 2400``: 48 inner loops), ``muon`` (issue 30),
``compress`` and ``global`` (issue 38); ``ladder`` / ``ladder_long`` (one Muon worker annealed to
each horizon from 300 to 3600 / 4800 to 9600 steps) and ``speedup`` (issue 47: the home link,
its fast twin, an uneven jittery fleet, the master apart, both ceilings).

**The speedup** (issue 47, ``speedup.py``): when the results hold ladder rungs, a last table
gives each arm's wall-clock speedup: one machine's time to the arm's final loss, read on the
rungs, over the arm's time including its flush; on the test slice (held-out batches 5-8, never
used to choose an arm) and on the dev slice (batches 1-4, the curves and every other table).

Prints one table per view and one JSON line (``{"benchmark": "diloco_convergence", ...}``);
``--out`` writes the JSON, ``--png`` plots eval loss against simulated wall-clock per ``f``
(matplotlib, imported only for the plot).
Targets (issue 19): at f = 0.25 with 4 equal nodes the chosen default within 1% of
free-communication synchronous DiLoCo and below ``a``; at f = 0.05 at least 2% below ``a``;
uneven nodes stable and no worse than equal nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(2, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from sim import Scale, make_config, parse_arm, run_job  # noqa: E402
from speedup import print_speedups  # noqa: E402
from train_text import write_stdlib_corpus  # noqa: E402  (the example's corpus)

LATENCIES = (0.05, 0.25, 1.0)
FREE = 0.001  # "free communication"
GRID = ["", "_keep", "_eager_keep", "_sync_keep"]  # boundary+reset (old default), ...
PRESETS = {
    "main": [
        "a",
        *[f"c_f{f}{mods}" for f in LATENCIES for mods in GRID],
        f"c_f{FREE}_sync_keep",
        "c_f0.25_eager_keep_lr0.7_m0.9",
    ],
    "tokens": ["a", "c_f0.25_sync_keep_tok", "c_f0.05_sync_keep_tok"],
    "uneven": ["a", "d_f0.25", "d_f0.25_eager_keep"],
    "corrections": ["a", "c_f0.25_eager_keep_bare", "d_f0.25_eager_keep_dylu"],
    "long": ["a", "c_f0.25", "c_f0.25_keep", "c_f0.25_eager_keep"],
    # issue 30: Muon as the inner optimizer against today's default (eager, AdamW kept), and
    # what an install's reset does to Muon's momentum
    "muon": [
        "a",
        "a_muon",
        *[f"c_f{f}_eager_keep{inner}" for f in (0.05, 0.25) for inner in ("", "_muon")],
        "c_f0.25_eager_muon",
    ],
    # issue 38: compressed deltas with and without error feedback, bytes charged over a link
    "compress": [
        "a_muon",
        *[
            f"c_f0.25_eager_keep_muon_bw_{enc}{ef}"
            for enc in ("bf16", "int8", "int4", "int2")
            for ef in ("", "_noef")
        ],
    ],
    # issue 38: the global as an int8 / int4 update on a keyframe, charged by its bytes
    "global": [
        "a_muon",
        *[
            f"c_f0.25_eager_keep_muon_bw_{arm}"
            for arm in ("bf16_gint8", "int4_gint8", "int4_gint4", "int2_gint8")
        ],
    ],
}
# issue 47: one machine annealed to each horizon (T in AdamW steps), the speedup's ladder
LADDER = (300, 450, 600, 750, 900, 1200, 1500, 1800, 2400, 3600)
LADDER_LONG = (4800, 7200, 9600)
HOME = "c_f0.25_eager_keep_muon_bw_int2_gint8"  # the recommended home-link setup
PRESETS |= {
    "ladder": [f"a_muon_s{n}" for n in LADDER],
    "ladder_long": [f"a_muon_s{n}" for n in LADDER_LONG],
    # the speedup at the scale's T: the home link, its fast twin, an uneven and jittery fleet,
    # the master apart (the simulator before issue 47), and both ceilings
    "speedup": [
        HOME,
        HOME.replace("f0.25", "f0.05"),
        "d" + HOME[1:] + "_jit0.3",
        HOME + "_mx",
        f"c_f{FREE}_sync_keep_muon",
        "a_muon_b32",
    ],
}
QUICK = dict(steps=8, inner_steps=2, batch=4, warmup=2, eval_every=2, eval_batches=1, eval_batch=32)
QUICK_ARMS = "a,c_f0.25,c_f0.25_eager_keep,c_f0.25_sync_keep,d_f0.25_eager_keep"


def expand_arms(spec: str) -> list[str]:
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        names += PRESETS.get(item, [item])
    for name in names:
        parse_arm(name)  # fails early on a typo
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------- many jobs


def run_all(
    arms: list[str], seeds: list[int], scale: Scale, jobs: int, corpus: str
) -> list[dict[str, Any]]:
    plan = [(arm, seed) for arm in arms for seed in seeds]
    if jobs <= 1:
        results = []
        for k, (arm, seed) in enumerate(plan, 1):
            results.append(run_job(arm, seed, scale, corpus))
            _progress(k, len(plan), results[-1])
        return results
    cost = {"single": 1, "equal": scale.workers, "uneven": scale.workers}
    plan.sort(key=lambda job: cost[parse_arm(job[0]).fleet], reverse=True)  # longest first
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="speedtronic-diloco-jobs-") as tmp,
        ThreadPoolExecutor(max_workers=jobs) as pool,
    ):
        futures = [
            pool.submit(_subprocess_job, arm, seed, scale, corpus, Path(tmp) / f"job{k}")
            for k, (arm, seed) in enumerate(plan)
        ]
        for k, future in enumerate(as_completed(futures), 1):
            results.append(future.result())
            _progress(k, len(plan), results[-1])
    order = {job: k for k, job in enumerate((a, s) for a in arms for s in seeds)}
    return sorted(results, key=lambda r: order[(r["arm"], r["seed"])])


def _subprocess_job(arm: str, seed: int, scale: Scale, corpus: str, stem: Path) -> dict:
    spec = {"arm": arm, "seed": seed, "scale": asdict(scale), "corpus": corpus}
    out = stem.with_suffix(".json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(spec)]
    done = subprocess.run(
        [*command, "--job-out", str(out)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        status = "error: " + " | ".join(tail)
        return {"arm": arm, "seed": seed, "status": status, "curve": [], "final_eval_loss": None,
                "latency": parse_arm(arm).latency}  # fmt: skip
    return json.loads(out.read_text())


def _progress(k: int, total: int, result: dict[str, Any]) -> None:
    final = result.get("final_eval_loss")
    text = f"{final:.4f}" if isinstance(final, float) else "-"
    print(
        f"[{k}/{total}] {result['arm']} seed {result['seed']}: final eval loss {text} "
        f"({result.get('wall_s', 0):.0f} s, {result.get('cpu_s', 0):.0f} CPU s, "
        f"{result['status']})",
        file=sys.stderr,
        flush=True,
    )


# ---------------------------------------------------------------------- summary


def reach_time(curve: list[list[float]], target: float | None, until_s: float) -> float | None:
    """When the published global first reaches ``target``, as a fraction of T (None: never;
    above 1: only the flushed global did)."""
    if target is None:
        return None
    for time_s, _, loss, _ in curve:
        if loss is not None and loss <= target:
            return time_s / until_s
    return None


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm: finals per seed, the relative gap to ``a`` per seed, reach times."""
    single = {r["seed"]: r["final_eval_loss"] for r in results if r["arm"] == "a"}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(r["arm"], []).append(r)
    rows = []
    for arm, runs in groups.items():
        runs.sort(key=lambda r: r["seed"])
        finals = [r.get("final_eval_loss") for r in runs]
        ok = all(isinstance(v, float) for v in finals)
        gaps = [
            100 * (v / single[r["seed"]] - 1) if ok and single.get(r["seed"]) else None
            for v, r in zip(finals, runs, strict=True)
        ]
        reach = [reach_time(r["curve"], single.get(r["seed"]), r.get("until_s", 1.0)) for r in runs]
        row = {
            "arm": arm,
            "latency": runs[0].get("latency"),
            "seeds": [r["seed"] for r in runs],
            "finals": finals,
            "final": statistics.mean(finals) if ok else None,
            "vs_a_pct": gaps,
            "vs_a_mean": statistics.mean(gaps) if all(g is not None for g in gaps) else None,
            "reach": reach,
            "status": sorted({r["status"] for r in runs}),
        }
        for key in ("idle_share", "rounds", "folded", "eager_installs", "deltas_per_round"):
            values = [r[key] for r in runs if key in r]
            row[key] = statistics.mean(values) if values else None
        steps = [statistics.mean(r["steps_per_worker"]) for r in runs if "steps_per_worker" in r]
        row["steps_per_worker"] = statistics.mean(steps) if steps else None
        rows.append(row)
    return rows


def _fmt(value: Any, spec: str, none: str = "-") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else none


def _reach_text(values: list[float | None]) -> str:
    return "/".join("never" if v is None else "flush" if v > 1 else f"{v:.2f}" for v in values)


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    if not rows:
        return
    print(f"\n{title}")
    head = (
        f"{'arm':<34}{'final (per seed)':<18}{'mean':>7}{'vs a':>9}{'spread':>8}"
        f"{'reach (xT)':>12}{'idle':>6}{'steps':>6}{'rounds':>7}{'folded':>7}  status"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        seeds = "/".join(_fmt(v, ".3f", "nan") for v in r["finals"])
        gaps = [g for g in r["vs_a_pct"] if g is not None]
        spread = f"{max(gaps) - min(gaps):.1f}" if len(gaps) > 1 else "-"
        print(
            f"{r['arm']:<34}{seeds:<18}{_fmt(r['final'], '.3f'):>7}"
            f"{_fmt(r['vs_a_mean'], '+.1f'):>8}%{spread:>8}{_reach_text(r['reach']):>12}"
            f"{_fmt(r['idle_share'], '.0%'):>6}{_fmt(r['steps_per_worker'], '.0f'):>6}"
            f"{_fmt(r['rounds'], '.0f'):>7}{_fmt(r['folded'], '.0f'):>7}  {','.join(r['status'])}"
        )


def _order(row: dict[str, Any]) -> tuple:
    """The grid's arms first, in GRID order, then the others by name."""
    suffix = row["arm"].split("_", 2)[-1] if row["arm"].count("_") > 1 else ""
    suffix = "_" + suffix if suffix else ""
    return (GRID.index(suffix) if suffix in GRID else len(GRID), row["arm"])


def print_report(rows: list[dict[str, Any]]) -> None:
    """The views: equal wall-clock per latency, equal tokens, uneven nodes."""
    rows = sorted(rows, key=_order)
    single = [r for r in rows if r["arm"] == "a" or r["arm"].startswith("a_")]
    equal = [r for r in rows if r["arm"].startswith("c_") and "_tok" not in r["arm"]]
    for f in sorted({r["latency"] for r in equal}):
        mine = [r for r in equal if r["latency"] == f]
        print_table(single + mine, f"equal wall-clock, 4 equal nodes, f = {f}")
    tokens = [r for r in rows if "_tok" in r["arm"]]
    if tokens:
        asynchronous = [r for r in equal if "_sync" not in r["arm"]]
        print_table(single + tokens + asynchronous, "equal tokens: every worker --steps steps")
    uneven = [r for r in rows if r["arm"].startswith("d_")]
    print_table(single + uneven, "equal wall-clock, uneven nodes")


# ---------------------------------------------------------------------- plot

STYLE = {  # arm suffix after c_f<x> -> (label, colour)
    "": ("boundary install, AdamW reset (old default)", "#d62728"),
    "_keep": ("boundary install, AdamW kept", "#ff7f0e"),
    "_eager_keep": ("eager install, AdamW kept", "#2ca02c"),
    "_sync_keep": ("blocking sync, AdamW kept", "#1f77b4"),
    "_eager_keep_lr0.7_m0.9": ("eager, kept, outer 0.7 / Nesterov 0.9", "#9467bd"),
    "_eager_keep_la": ("eager, kept, momentum look-ahead", "#8c564b"),
    "_eager_keep_dylu": ("eager, kept, inner_steps by speed", "#e377c2"),
}


def mean_curve(runs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The seeds' mean loss of the latest published global, at every time any seed changed."""
    until = runs[0].get("until_s", 1.0)
    times = sorted({p[0] for r in runs for p in r["curve"]})
    xs, ys = [], []
    for t in times:
        values = []
        for r in runs:
            points = [p[2] for p in r["curve"] if p[0] <= t and p[2] is not None]
            values.append(points[-1] if points else math.nan)
        xs.append(t / until)
        ys.append(statistics.mean(values))
    return xs, ys


def plot(results: list[dict[str, Any]], long: list[dict[str, Any]], png: str) -> None:
    """Eval loss of the published global against simulated wall-clock: one panel per f, one
    for uneven nodes, one for the long horizon."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["curve"]:
            by_arm.setdefault(r["arm"], []).append(r)
    panels = [(f"f = {f}", f"c_f{f}") for f in LATENCIES] + [("uneven nodes, f = 0.25", "d_f0.25")]
    fig, axes = plt.subplots(2, 3, figsize=(17, 10))
    for ax, (title, prefix) in zip(axes.flat, panels, strict=False):
        arms = [a for a in by_arm if a == prefix or a.startswith(prefix + "_")]
        arms = [a for a in arms if "_tok" not in a]  # equal tokens: another clock
        if prefix.startswith("c_f0.25"):
            arms.append(f"c_f{FREE}_sync_keep")
        if prefix.startswith("d_"):
            arms.append("c_f0.25_eager_keep")
        _panel(ax, by_arm, arms, prefix, title)
    ax = axes.flat[4]
    if long:
        long_by_arm: dict[str, list[dict[str, Any]]] = {}
        for r in long:
            long_by_arm.setdefault(r["arm"], []).append(r)
        loops = round(long[0].get("until_s", 0) / 15.0)  # L = 50 steps x 0.3 s
        fs = sorted({parse_arm(a).latency for a in long_by_arm if a != "a"})
        title = f"long horizon: {loops} inner loops, f = {' and '.join(f'{f:g}' for f in fs)}"
        _panel(ax, long_by_arm, [a for a in long_by_arm if a != "a"], "c_f0.25", title)
    else:
        ax.axis("off")
    _bars(axes.flat[5], summarize(results))
    fig.suptitle(
        "DumbDiLoCo at equal simulated wall-clock: 0.43M-param decoder, 4 workers, H = 50; "
        "upload and publish f x L, download f/2 x L, polls every f x L (mean of 2 seeds)"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}", file=sys.stderr)


def _panel(ax: Any, by_arm: dict, arms: list[str], prefix: str, title: str) -> None:
    low, high, worst = math.inf, 0.0, 0.0
    for arm in ["a", *arms]:
        runs = by_arm.get(arm)
        if not runs:
            continue
        xs, ys = mean_curve(runs)
        suffix = arm[len(prefix) :] if arm.startswith(prefix) else None
        label, color = STYLE.get(suffix, (arm, None)) if suffix is not None else (arm, None)
        if arm == "a":
            label, color = "1 worker", "#7f7f7f"
        elif arm.startswith(f"c_f{FREE}"):
            label, color = "free communication, sync, kept (bound)", "#000000"
        elif prefix.startswith("d_") and arm.startswith("c_"):
            label, color = "4 equal nodes, eager, kept", "#17becf"
        style = "--" if arm == "a" or arm.startswith(f"c_f{FREE}") else "-"
        final = statistics.mean(r["final_eval_loss"] or math.nan for r in runs)
        worst = max(worst, final) if math.isfinite(final) else worst
        ax.plot(xs, ys, style, drawstyle="steps-post", color=color, lw=1.5,
                label=f"{label}: {final:.3f}")  # fmt: skip
        finite = [y for y in ys if math.isfinite(y)]
        low = min([low, *finite])
        if arm == "a" and len(finite) > 4:
            high = finite[len(finite) // 4]
    if "a" in by_arm:
        ax.axhline(statistics.mean(r["final_eval_loss"] for r in by_arm["a"]), color="#7f7f7f",
                   lw=0.6)  # fmt: skip
    if math.isfinite(low):
        ax.set_ylim(low - 0.03, max(high, low + 0.3, worst + 0.05))  # every arm's end shows
    ax.set_xlim(0, 1.08)
    ax.axvline(1.0, color="k", lw=0.5, ls=":")
    ax.set_title(title)
    ax.set_xlabel("simulated wall-clock / T (past the dotted line: the flush)")
    ax.set_ylabel("held-out eval loss of the published global")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper right")


def _bars(ax: Any, rows: list[dict[str, Any]]) -> None:
    rows = [r for r in rows if r["vs_a_mean"] is not None and r["arm"] != "a"]
    rows.sort(key=lambda r: r["vs_a_mean"])
    ax.barh(range(len(rows)), [r["vs_a_mean"] for r in rows], color="#1f77b4")
    for y, r in enumerate(rows):
        gaps = r["vs_a_pct"]
        ax.plot([min(gaps), max(gaps)], [y, y], color="k", lw=1.2)
    ax.set_yticks(range(len(rows)), [r["arm"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("final eval loss vs 1 worker at equal wall-clock, % (line: the 2 seeds)")
    ax.set_title("every arm: mean of seeds, lower is better")
    ax.grid(alpha=0.3, axis="x")


# ---------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", default="main", help="comma list of arms and presets (main)")
    p.add_argument("--seeds", help="comma list (default 0,1; --quick: 0)")
    p.add_argument("--out", help="write the results JSON here")
    p.add_argument("--jobs", type=int, default=1, help="parallel subprocesses (1 thread each)")
    p.add_argument("--threads", type=int, help="torch threads in-process (default: torch's)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seed 0: checks it runs")
    p.add_argument("--steps", type=int, help="steps of one worker in T (600)")
    p.add_argument("--inner-steps", type=int, help="H (50)")
    p.add_argument("--batch", type=int, help="sequences per worker step (8)")
    p.add_argument("--eval-batches", type=int, help="held-out batches of 128 sequences (4)")
    p.add_argument("--speeds", help="uneven workers' speeds (1,1.3,2.6,5.7)")
    p.add_argument("--corpus", help="a UTF-8 text file instead of the stdlib sources")
    p.add_argument(
        "--bandwidth",
        type=float,
        help="bw arms: a node's uplink, Mbit per simulated second (default: the one on which a "
        "bf16 delta takes f x L)",
    )
    p.add_argument("--down-ratio", type=float, help="bw arms: downlink / uplink (5, cable)")
    p.add_argument("--master-up-ratio", type=float, help="bw arms: master's / a node's uplink (1)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="report (and plot) saved results")
    p.add_argument("--long", metavar="JSON", help="the long-horizon results, for the plot")
    p.add_argument("--png", help="write the plot here")
    p.add_argument(
        "--muon-cost",
        action="store_true",
        help="measure a Muon worker step's time over an AdamW one's (MUON_STEP_COST)",
    )
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--job-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args


def build_scale(args: argparse.Namespace) -> Scale:
    values: dict[str, Any] = dict(QUICK) if args.quick else {}
    for key, attr in [("steps", "steps"), ("inner_steps", "inner_steps"), ("batch", "batch")]:
        if getattr(args, attr) is not None:
            values[key] = getattr(args, attr)
    if args.eval_batches is not None:
        values["eval_batches"] = args.eval_batches
    if args.speeds:
        values["speeds"] = tuple(float(s) for s in args.speeds.split(","))
    if args.bandwidth is not None:
        values["bandwidth"] = args.bandwidth * 1e6 / 8  # bytes per simulated second
    for key in ("down_ratio", "master_up_ratio"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    return Scale(**values)


def report_of(results: list[dict], scale: dict, extra: dict[str, Any]) -> dict[str, Any]:
    rows = summarize(results)
    return {"benchmark": "diloco_convergence", "scale": scale, **extra, "summary": rows,
            "results": results}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job:  # one job in a subprocess of --jobs
        torch.set_num_threads(1)
        spec = json.loads(args.job)
        scale = Scale(**{**spec["scale"], "speeds": tuple(spec["scale"]["speeds"])})
        result = run_job(spec["arm"], spec["seed"], scale, spec["corpus"])
        Path(args.job_out).write_text(json.dumps(result))
        return 0
    if args.muon_cost:
        torch.set_num_threads(args.threads or 1)
        with tempfile.TemporaryDirectory(prefix="speedtronic-diloco-cost-") as tmp:
            corpus = args.corpus or str(Path(tmp) / "stdlib.txt")
            if not args.corpus:
                write_stdlib_corpus(Path(corpus))
            print(json.dumps(muon_step_cost(build_scale(args), corpus, Path(tmp))))
        return 0
    if args.merge:
        reports = [json.loads(Path(p).read_text()) for p in args.merge]
        results = list({(r["arm"], r["seed"]): r for rep in reversed(reports)
                        for r in rep["results"]}.values())  # fmt: skip
        # the first file's run of an (arm, seed) wins (arm a runs again in every batch)
        report = report_of(results, reports[0]["scale"], {"merged": args.merge})
    else:
        report = run(args)
    print_report(report["summary"])
    report["speedup"] = print_speedups(report["results"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    if args.png:
        long = json.loads(Path(args.long).read_text())["results"] if args.long else []
        plot(report["results"], long, args.png)
    print(json.dumps({k: v for k, v in report.items() if k != "results"}))
    return 0


def muon_step_cost(scale: Scale, corpus: str, tmp: Path, rounds: int = 16, steps: int = 25):
    """A worker step with Muon over one with AdamW (the same model, batch and data), timed
    in alternated rounds (ABBA) of ``steps`` steps after a warm-up round, in process CPU time
    (one thread); the median of the rounds' ratios."""
    from speedtronic.runtime import build_runtime

    runtimes = {}
    for inner in ("adamw", "muon"):
        config = make_config(scale, corpus, str(tmp / inner), 1, scale.batch, 10**6, inner=inner)
        runtimes[inner] = build_runtime(config, console=False)
    times: dict[str, list[float]] = {"adamw": [], "muon": []}
    for r in range(rounds + 1):
        for inner in ("adamw", "muon") if r % 2 == 0 else ("muon", "adamw"):
            start = time.process_time()  # CPU time: a loaded machine's wall-clock is noise
            for _ in range(steps):
                runtimes[inner].trainer.train_step()
            if r:  # round 0 warms up
                times[inner].append(time.process_time() - start)
    ratios = [m / a for a, m in zip(times["adamw"], times["muon"], strict=True)]
    return {"muon_step_cost": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "adamw_step_ms": 1000 * statistics.median(times["adamw"]) / steps,
            "load": os.getloadavg()[0], "threads": torch.get_num_threads()}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = build_scale(args)
    arms = expand_arms(QUICK_ARMS if args.quick and args.arms == "main" else args.arms)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="speedtronic-diloco-corpus-") as tmp:
        corpus = args.corpus or str(Path(tmp) / "stdlib.txt")
        if not args.corpus:
            size = write_stdlib_corpus(Path(corpus))
            print(
                f"corpus: {size / 1e6:.1f} MB of Python stdlib source; {len(arms)} arms x "
                f"{len(seeds)} seeds, {args.jobs} at a time",
                file=sys.stderr,
                flush=True,
            )
        results = run_all(arms, seeds, scale, args.jobs, corpus)
    extra = {
        "arms": arms,
        "seeds": seeds,
        "wall_s": time.perf_counter() - start,
        "cpu_s": sum(r.get("cpu_s", 0.0) for r in results),
        "jobs": args.jobs,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "host": host_cpu(),
    }
    for result in results:  # a merge of several runs keeps each result's host
        result.setdefault("host", extra["host"])
    return report_of(results, asdict(scale), extra)


def host_cpu() -> dict[str, Any]:
    """The CPU that made the losses (issue 54): Muon's bf16 matmuls round differently where
    oneDNN has AMX, so a speedup is read against a ladder from the same kind of CPU. The ISA
    and the kernel oneDNN picks for a bf16 matmul are what its verbose mode prints, from a
    subprocess with this environment (``ONEDNN_MAX_CPU_ISA`` pins it); None where oneDNN does
    not run bf16 matmuls (a CPU without AVX-512, or pinned below it)."""
    probe = "import torch; x = torch.ones(64, 64, dtype=torch.bfloat16); x @ x"
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    lines = [line for line in out.splitlines() if line.startswith("onednn_verbose")]
    isa = next((line.split("isa:", 1)[1] for line in lines if ",cpu,isa:" in line), None)
    fields = [line.split(",") for line in lines]
    matmul = next((f[6] for f in fields if f[3:6] == ["exec", "cpu", "matmul"]), None)
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_isa": isa,
        "onednn_bf16_matmul": matmul,
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "cpu_model": cpu_model(),
    }


def cpu_model() -> str | None:
    """``model name`` from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


if __name__ == "__main__":
    sys.exit(main())

"""A fleet against the Hub's commit budget: what it does when the repo answers 429 (issue 54
item 7).

Usage::

    python benchmarks/diloco/commit_budget.py                       # 2 arms, ~2 x 1 min
    python benchmarks/diloco/commit_budget.py --commit-limit 4 --commit-window 20
    PYTHONPATH=/path/to/main python benchmarks/diloco/commit_budget.py  # other code

The Hub refuses commits beyond about 128 an hour per repo. Here the Hub emulator (a process,
tests/hub_emulator.py, as tests/hub/test_e2e.py starts it) refuses commits beyond
``--commit-limit`` per ``--commit-window`` seconds (tests/hub_emulator_budget.py): a budget
scaled down so that a tiny fleet's cadence exceeds it, answered 429 with the headers the Hub's
client parses, the refused commit not applied. The fleet is a coordinating master and two
workers, ``python -m speedtronic train`` processes (tiny model, ``inner_steps`` 5, no publish
pacing, ``global_dtype`` deltas and ``delta_dtype`` int2 as in the issue's example), run
twice: without the budget, then with it. Per arm: commits made and refused (429s), deltas
uploaded and applied (per round: more than one a round means deltas were folded together),
outer steps reached, the client's retries, wall time, and whether the run ended whole (every
process exit 0, every worker's last delta in the final step count, none left pending). Prints
one table and a JSON line per arm.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import hub.test_e2e as e2e  # noqa: E402
import proc_support  # noqa: E402
from hub.test_e2e import (  # noqa: E402
    REPO,
    WORKERS,
    Emulator,
    events,
    master_rounds,
    pending_deltas,
    start,
    step_count,
)

FLEET = {"global_dtype": "deltas", "delta_dtype": "int2", "outer_momentum": 0.0}


def run_arm(tmp: Path, steps: int, budget: tuple[int, float] | None) -> dict:
    """One fleet run, with the emulator's commit budget or without; what it did."""
    args = () if budget is None else ("--commit-limit", str(budget[0]))
    args += () if budget is None else ("--commit-window", str(budget[1]))
    began = time.monotonic()
    emulator = Emulator(tmp, *args)
    client = emulator.client(tmp)
    processes = []
    try:
        master = start(tmp, emulator.url, "master", "master", 1, train_locally=False, **FLEET)
        processes.append(master)
        while step_count(client) is None and master.poll() is None:
            time.sleep(0.2)
        processes += [start(tmp, emulator.url, "worker", w, steps, **FLEET) for w in WORKERS]
        codes = {
            n: proc_support.wait(p) for n, p in zip(["master", *WORKERS], processes, strict=True)
        }
        left, final = pending_deltas(client), step_count(client) or {}
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        stats = emulator.stop()
    return summary(tmp, stats, codes, left, final, time.monotonic() - began)


def summary(tmp: Path, stats: dict, codes: dict, left: list, final: dict, wall_s: float):
    rounds = master_rounds(tmp)
    commits = stats["commits"][REPO]
    posts = [s for m, p, s in stats["requests"] if m == "POST" and "/commit/" in p]
    logs = {n: (tmp / f"{n}.log").read_text() for n in ["master", *WORKERS]}
    # a call that ran out of attempts (8, each after the reset the 429 named, capped)
    gave_up = {n: t.count("gave up after") for n, t in logs.items()}
    uploads = sum(len(events(tmp, w, "diloco_upload")) for w in WORKERS)
    nodes = final.get("nodes", {})
    whole = (
        all(c == 0 for c in codes.values())
        and not left
        and all(nodes.get(w, {}).get("final") for w in WORKERS)
        and all("holds this node's last delta" in logs[w] for w in WORKERS)
        and not any("Traceback" in t for t in logs.values())
    )
    ends = [events(tmp, w, "run_end")[-1] for w in WORKERS]
    boundaries = [events(tmp, w, "diloco_boundary") for w in WORKERS]
    return {
        "wall_s": round(wall_s, 1),
        "worker_train_s": [round(e["elapsed_s"], 1) for e in ends],
        "worker_stall_s": [round(sum(b["stall_s"] for b in bs), 2) for bs in boundaries],
        "inner_loops": sum(e["steps"] for e in ends) // e2e.CONFIG["distributed"]["inner_steps"],
        "uploads_given_up": sum(bs[-1]["upload_failures"] for bs in boundaries if bs),
        "exit_codes": codes,
        "outer_steps": final.get("outer_step"),
        "rounds": len(rounds),
        "deltas_uploaded": uploads,
        "deltas_applied": sum(r[1] for r in rounds),
        "max_deltas_in_a_round": max((r[1] for r in rounds), default=0),
        "master_polls_failed": logs["master"].count("poll failed"),
        "stale_or_rejected": sum(r[2] + r[3] for r in rounds),
        "commits": len(commits),
        "commits_per_min": round(60 * len(commits) / wall_s, 1),
        "commit_posts": len(posts),
        "commits_refused_429": posts.count(429),
        "calls_given_up": gave_up,
        "left_pending": len(left),
        "ended_whole": whole,
    }


def arm_dir(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="per worker (5 per inner loop)")
    parser.add_argument("--batch", type=int, default=256, help="micro-batch: sets the step time")
    parser.add_argument("--commit-window", type=float, default=60.0, help="seconds")
    parser.add_argument(
        "--overload",
        type=float,
        default=225 / 128,
        help="the unlimited arm's commit rate over the budget (the issue's 225 / 128)",
    )
    parser.add_argument("--commit-limit", type=int, default=None, help="else from --overload")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' files here")
    args = parser.parse_args(argv)
    e2e.BATCH = args.batch
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        results["no budget"] = run_arm(arm_dir(root, "no_budget"), args.steps, None)
        rate = results["no budget"]["commits_per_min"] * args.commit_window / 60
        limit = args.commit_limit or max(2, round(rate / args.overload))
        budget = (limit, args.commit_window)
        results["budget"] = run_arm(arm_dir(root, "budget"), args.steps, budget)
    keys = list(results["budget"])
    print(f"{'':24}" + "".join(f"{n:>46}" for n in results))
    for key in keys:
        print(f"{key:24}" + "".join(f"{json.dumps(r[key]):>46}" for r in results.values()))
    for name, result in results.items():
        spent = None if name == "no budget" else list(budget)
        print(json.dumps({"arm": name, "budget": spent, "steps": args.steps, **result}))
    return 0 if all(r["ended_whole"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

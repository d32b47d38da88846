"""The speedup (issue 47): one machine's wall-clock to reach a fleet's final loss, over the fleet's.

One machine's time to a loss L, t1(L), is read on a ladder of single-machine runs (arms
``a_muon_s<n>``, ``a_s<n>``: one worker, each annealed to its own horizon of n steps' time), not
on one long curve: between the two consecutive rungs whose final losses bracket L, linear in L
against log time. A rung no better than a shorter one is left out (the lower envelope). Outside
the ladder the figure is a bound, never extrapolated: ``<=`` when the shortest rung already
reaches L, ``>`` when the longest does not.

The fleet's time is its clock including the end-of-run flush (``flushed_s``); an arm without a
flush (one machine, data parallel as ``a_muon_b32``) stops at its ``until_s``. Each arm is read
against the ladder of its own inner optimizer and seed, on two held-out slices: ``dev`` (the
slice the arms are chosen on, ``final_eval_loss``) and ``test`` (the next slice, never used to
choose anything, ``final_test_loss``): the headline is ``test``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sim import Scale, parse_arm

SLICES = {"test": "final_test_loss", "dev": "final_eval_loss"}


def is_rung(arm_name: str) -> bool:
    """One worker at the scale's batch: a rung of the ladder (its horizon is ``until_s``)."""
    arm = parse_arm(arm_name)
    return arm.fleet == "single" and arm.batch is None


def ladder(results: list[dict[str, Any]], seed: int, inner: str, key: str) -> list[tuple]:
    """(horizon s, final loss) of the rungs of one seed and inner optimizer, by horizon."""
    rungs = {
        r["until_s"]: r[key]
        for r in results
        if r["seed"] == seed and is_rung(r["arm"]) and parse_arm(r["arm"]).inner == inner
        if isinstance(r.get(key), float)
    }
    return sorted(rungs.items())


def time_to_reach(rungs: list[tuple[float, float]], target: float) -> tuple[float, str] | None:
    """t1(target) and how it relates to the truth: ``=`` read between rungs, ``<=`` the shortest
    rung reaches it (t1 is at most that), ``>`` no rung does (t1 is more). None: no rungs."""
    envelope: list[tuple[float, float]] = []
    for time_s, loss in rungs:
        if not envelope or loss < envelope[-1][1]:
            envelope.append((time_s, loss))
    if not envelope:
        return None
    if target >= envelope[0][1]:
        return envelope[0][0], "<="
    for (t0, l0), (t1, l1) in zip(envelope, envelope[1:], strict=False):
        if l1 <= target:
            share = (l0 - target) / (l0 - l1)
            return math.exp(math.log(t0) + share * (math.log(t1) - math.log(t0))), "="
    return envelope[-1][0], ">"


def arm_time(result: dict[str, Any]) -> float:
    """The arm's wall-clock: the fleet's with its flush, else its time budget."""
    return result.get("flushed_s") or result["until_s"]


def speedup_of(result: dict[str, Any], results: list[dict[str, Any]], key: str) -> dict | None:
    """One run's speedup on one slice: ``{"x": ..., "relation": ...}``; None if unreadable."""
    final = result.get(key)
    inner = parse_arm(result["arm"]).inner
    found = time_to_reach(ladder(results, result["seed"], inner, key), final) if final else None
    if found is None:
        return None
    t1, relation = found
    return {"x": t1 / arm_time(result), "relation": relation}


def speedup_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm that is not a rung: its speedup per seed on each slice, and the mean."""
    arms = list(dict.fromkeys(r["arm"] for r in results if not is_rung(r["arm"])))
    rows = []
    for arm in arms:
        runs = sorted((r for r in results if r["arm"] == arm), key=lambda r: r["seed"])
        row: dict[str, Any] = {"arm": arm, "seeds": [r["seed"] for r in runs]}
        # an uneven fleet against its own fastest machine (speeds: the fleet's mean is 1)
        row["fastest"] = max(runs[0].get("speeds") or [1.0])
        for name, key in SLICES.items():
            figures = [speedup_of(r, results, key) for r in runs]
            row[name] = figures
            exact = [f["x"] for f in figures if f and f["relation"] == "="]
            row[f"{name}_mean"] = statistics.mean(exact) if len(exact) == len(runs) else None
        rows.append(row)
    return rows


def _text(figure: dict | None) -> str:
    if figure is None:
        return "-"
    mark = {"=": "", "<=": "<=", ">": ">"}[figure["relation"]]
    return f"{mark}{figure['x']:.2f}"


def print_speedups(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The speedup table (nothing when the results hold no ladder); returns its rows."""
    if not any(is_rung(r["arm"]) and parse_arm(r["arm"]).steps for r in results):
        return []
    rows = speedup_rows(results)
    step_s = Scale().step_seconds
    rungs = sorted({round(r["until_s"] / step_s) for r in results if is_rung(r["arm"])})
    print(f"\nspeedup: one machine's time to the arm's final loss / its time (ladder: {rungs})")
    head = f"{'arm':<58}{'test (per seed)':<22}{'mean':>6}   {'dev (per seed)':<22}{'mean':>6}"
    print(head)
    print("-" * len(head))
    for row in rows:
        cells = []
        for name in SLICES:
            seeds = "/".join(_text(f) for f in row[name])
            mean = row[f"{name}_mean"]
            cells.append(f"{seeds:<22}{(f'{mean:.2f}' if mean else '-'):>6}")
        fastest, mean = row["fastest"], row["test_mean"]
        against = f"   vs its fastest machine: {mean / fastest:.2f}" if fastest > 1 and mean else ""
        print(f"{row['arm']:<58}{'   '.join(cells)}{against}")
    return rows

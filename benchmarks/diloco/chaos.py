"""A DumbDiLoCo fleet under chaos, against the same fleet run clean: what a crash costs (issue 47).

Usage::

    python benchmarks/diloco/chaos.py --chaos 7                 # clean, then chaotic, seed 7
    python benchmarks/diloco/chaos.py --chaos 7 --steps 600 --no-clean

A training master and ``--workers`` workers (``speedtronic train`` processes, each started by
``chaos_node.py``) share a directory repo, with the home-link settings the docs recommend (int2
deltas with error feedback, an int8 global); one more worker joins at 30% of the master's steps.
The chaotic run, on a schedule seeded by ``--chaos``: every ``--kill-every`` seconds a random
running worker that has a checkpoint is killed -9 and restarted with ``--resume`` after a random
delay; the master is killed -9 once in its end-of-run wait and restarted with ``--resume``; and
about ``--fault-rate`` of every node's uploads and downloads fail as the Hub's and S3's
transports fail (``chaos_node.FaultyTransport``). The schedule is seeded; which process a kill
finds where is not (threads and the machine decide), so two runs of one seed differ a little.

Reported per run: each node's exit codes (``-9``: killed by the schedule), the master's final
line, the final global's held-out loss, and the work lost: optimizer steps trained but never
counted in the final global (``step_count.json``'s ``steps_total``), each with its reason. Prints
a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
NODE = Path(__file__).with_name("chaos_node.py")
MODEL = {"name": "reference_transformer", "vocab_size": 64, "seq_len": 32, "n_layer": 1,
         "n_head": 2, "d_model": 32}  # fmt: skip
FINAL_RE = re.compile(r"diloco master: final global .*")
STALE_RE = re.compile(r"(nodes/[^ ]+\.safetensors) is too stale")
REJECTED_RE = re.compile(r"rejected (nodes/[^ :]+\.safetensors)")
REPLAYED_RE = re.compile(r"previous process sent its inner loops up to step (\d+)")
STEP_RE = re.compile(r"^step (\d+)/", re.MULTILINE)


@dataclass
class Plan:
    """The run's shape and schedule (seconds are wall clock; ``step_s`` paces every node)."""

    steps: int = 1200  # every node's max_steps
    workers: int = 2  # started with the master; one more joins at 30%
    inner_steps: int = 20
    step_s: float = 0.01
    kill_every_s: float = 6.0
    restart_s: tuple[float, float] = (1.0, 3.0)
    master_kill_s: tuple[float, float] = (0.5, 2.0)  # after its training ended
    fault_rate: float = 0.1
    timeout_s: float = 600.0


@dataclass
class Node:
    name: str
    role: str
    processes: list = field(default_factory=list)  # (Popen, log path, killed)
    kills: list = field(default_factory=list)  # (kill time, restart time or None)

    @property
    def current(self):
        return self.processes[-1][0] if self.processes else None

    def running(self) -> bool:
        return self.current is not None and self.current.poll() is None


class Fleet:
    """One run: its nodes, its schedule's random draws, its events."""

    def __init__(self, work: Path, plan: Plan, seed: int, chaos: bool):
        self.work, self.plan, self.seed, self.chaos = work, plan, seed, chaos
        self.rng = random.Random(seed)
        self.nodes = {"m": Node("m", "master")}
        self.nodes.update({f"w{i}": Node(f"w{i}", "worker") for i in range(1, plan.workers + 1)})
        self.late = f"w{plan.workers + 1}"
        self.restarts: dict[str, float] = {}  # node -> when to restart it
        self.events: list[dict] = []
        self.began = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.began

    def config(self, node: Node) -> Path:
        plan = self.plan
        distributed = {
            "enabled": True, "role": node.role, "node_id": node.name,
            "repo_id": str(self.work / "repo"), "inner_steps": plan.inner_steps,
            "poll_interval": 0.2, "min_deltas": 1, "max_wait_s": 0.5,
            "delta_dtype": "int2", "global_dtype": "int8", "drain_timeout_s": 60.0,
        }  # fmt: skip
        config = {
            "run": {"seed": 0, "device": "cpu", "name": node.name, "max_steps": plan.steps},
            "model": MODEL,
            "data": {"micro_batch_size": 8},
            "optimizer": {"lr": 1e-2},
            "scheduler": {"warmup_steps": 2},
            "checkpoint": {"interval": plan.inner_steps},
            "logging": {"every_steps": 1, "json_file": "metrics.jsonl"},
            "distributed": distributed,
        }
        path = self.work / f"{node.name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def launch(self, node: Node, resume: bool = False) -> None:
        index = len(node.processes)
        log = self.work / f"{node.name}-{index}.log"
        out = self.work / node.name
        rate = self.plan.fault_rate if self.chaos else 0.0
        command = [sys.executable, str(NODE), "--seed", f"{self.seed}:{node.name}:{index}",
                   "--fault-rate", str(rate), "--step-s", str(self.plan.step_s),
                   "--faults-log", str(self.work / "faults.log"), "--",
                   "train", "-c", str(self.config(node)), "--output-dir", str(out)]  # fmt: skip
        command += ["--resume"] * resume
        # unbuffered: a process killed -9 leaves every line it printed (the account needs them)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with open(log, "w") as handle:
            process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
        node.processes.append([process, log, False])
        self.events.append({"t": round(self.now(), 1), "event": "start", "node": node.name,
                            "resume": resume})  # fmt: skip

    def kill(self, node: Node, restart_in: float) -> None:
        node.current.send_signal(signal.SIGKILL)
        node.current.wait()
        node.processes[-1][2] = True
        node.kills.append([self.now(), None])
        self.restarts[node.name] = self.now() + restart_in
        self.events.append({"t": round(self.now(), 1), "event": "kill -9", "node": node.name,
                            "at_step": reached(self.work / node.name)})  # fmt: skip


def reached(out: Path) -> int:
    """The newest optimizer step the node's metrics log shows (0 before any)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - 8192))
        tail = handle.read().decode(errors="replace")
    steps = re.findall(r'"event": "train_step", [^\n]*?"step": (\d+)', tail)
    return int(steps[-1]) if steps else 0


def trains(fleet: Fleet, node: Node) -> bool:
    """Whether a kill now costs work: the node's current process trained an inner loop past
    where it started, and has a checkpoint to resume from."""
    start, end, _ = span(node.processes[-1][1])
    done = (fleet.work / node.name / "checkpoints" / "latest.json").exists()
    return end - start >= fleet.plan.inner_steps and done


def tick(fleet: Fleet, next_kill: list[float], master_kill: list) -> None:
    """One look at the fleet: the late joiner, restarts due, the schedule's kills."""
    plan, now, master = fleet.plan, fleet.now(), fleet.nodes["m"]
    if fleet.late not in fleet.nodes and reached(fleet.work / "m") >= 0.3 * plan.steps:
        fleet.nodes[fleet.late] = Node(fleet.late, "worker")
        fleet.launch(fleet.nodes[fleet.late])
    for name, when in list(fleet.restarts.items()):
        if now >= when:
            del fleet.restarts[name]
            fleet.nodes[name].kills[-1][1] = now
            fleet.launch(fleet.nodes[name], resume=True)
    if not fleet.chaos:
        return
    if now >= next_kill[0]:
        next_kill[0] += plan.kill_every_s
        workers = [n for n in fleet.nodes.values() if n.role == "worker"]
        ready = [n for n in workers if n.running() and trains(fleet, n)]
        if ready:
            fleet.kill(fleet.rng.choice(ready), fleet.rng.uniform(*plan.restart_s))
    trained = reached(fleet.work / "m") >= plan.steps
    if trained and master_kill[0] is None and master.running():
        master_kill[0] = now + fleet.rng.uniform(*plan.master_kill_s)
    if master_kill[0] is not None and not master_kill[1] and now >= master_kill[0]:
        master_kill[1] = True
        if master.running():
            fleet.kill(master, fleet.rng.uniform(*plan.restart_s))


def used(work: Path, plan: Plan) -> Path | None:
    """What ``work`` holds of an earlier run: the repo, a node's folder or the faults log. A run
    there would read it as its own (a second run whose workers trained nothing reported the
    first run's final loss), so a used ``work`` is refused, never cleared."""
    names = ["repo", "faults.log", "m", *(f"w{i}" for i in range(1, plan.workers + 2))]
    return next((work / name for name in names if os.path.lexists(work / name)), None)


def run_fleet(work: Path, plan: Plan, seed: int, chaos: bool) -> dict:
    """One run, clean or chaotic, in a ``work`` no run used; returns its report (``report``)."""
    if used(work, plan) is not None:
        raise FileExistsError(f"{used(work, plan)}: {work} holds an earlier run")
    work.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(work, plan, seed, chaos)
    fleet.launch(fleet.nodes["m"])  # it creates the repo: a worker never does
    published = work / "repo" / "global" / "step_count.json"
    while not published.exists() and fleet.nodes["m"].running():
        time.sleep(0.1)
    for node in list(fleet.nodes.values())[1:]:
        fleet.launch(node)
    next_kill, master_kill = [plan.kill_every_s], [None, False]
    try:
        while fleet.now() < plan.timeout_s:
            tick(fleet, next_kill, master_kill)
            started = fleet.late in fleet.nodes
            if (
                started
                and not fleet.restarts
                and not any(n.running() for n in fleet.nodes.values())
            ):
                break
            time.sleep(0.1)
    finally:
        for node in fleet.nodes.values():
            if node.running():
                node.current.kill()
                node.current.wait()
                node.processes[-1][2] = "timeout"
    return report(fleet)


def report(fleet: Fleet) -> dict:
    from speedtronic.distributed.transport import LocalTransport

    repo = LocalTransport(fleet.work / "repo")
    counted = (repo.read_step_count() or {}).get("nodes", {})
    left = {r.path for r in repo.list_deltas() if r.problem is None}
    master_logs = [p[1].read_text() for p in fleet.nodes["m"].processes]
    finals = FINAL_RE.findall(master_logs[-1]) if master_logs else []
    loss, problem = final_loss(fleet.work / "m" / "final_global")
    nodes = {name: node_report(fleet, node, counted, left, master_logs)
             for name, node in fleet.nodes.items()}  # fmt: skip
    return {
        "chaos": fleet.chaos,
        "wall_s": round(fleet.now(), 1),
        "final_loss": loss,
        "final_global_problem": problem,
        "master_last_line": finals[-1] if finals else None,
        "outer_step": (repo.read_step_count() or {}).get("outer_step"),
        "faults": faults(fleet.work / "faults.log"),
        "nodes": nodes,
        "events": fleet.events,
        "work": str(fleet.work),
    }


def span(log: Path) -> tuple[int, int, int]:
    """(the step a process started from, the newest it trained, the step up to which its
    killed predecessor had sent what it trains again) from its own log: the metrics JSONL is
    no help, ``--resume`` rewinds it to the checkpoint."""
    text = log.read_text()
    steps = [int(n) for n in STEP_RE.findall(text)]
    replayed = [int(n) for n in REPLAYED_RE.findall(text)]
    start = steps[0] - 1 if steps else 0
    return start, (steps[-1] if steps else start), (replayed[0] if replayed else start)


def landed(work: Path) -> dict[str, int]:
    """repo path -> steps of every delta that landed (``chaos_node``'s account)."""
    log, found = work / "faults.log", {}
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split(" ")
        if parts[1] == "landed":
            found[parts[3]] = int(parts[4])
    return found


def node_report(fleet: Fleet, node: Node, counted: dict, left: set, master_logs: list) -> dict:
    """What the node trained, what the final global counts, and why the rest is not there."""
    spans = [span(p[1]) for p in node.processes]
    trained = sum(end - start for start, end, _ in spans)
    replayed = sum(max(0, min(to, end) - start) for start, end, to in spans)
    sent, text = landed(fleet.work), "".join(master_logs)

    def steps_of(paths: set[str]) -> int:
        return sum(sent.get(p, 0) for p in paths if p.startswith(f"nodes/{node.name}/"))

    lost = {
        "trained again after --resume (the killed process had sent them)": replayed,
        "too stale": steps_of(set(STALE_RE.findall(text))),
        "rejected": steps_of(set(REJECTED_RE.findall(text))),
        "left in the repo": steps_of(left),
    }
    entry = counted.get(node.name) or {}
    in_global = entry.get("steps_total", 0)
    lost["killed -9 before it sent them"] = trained - in_global - sum(lost.values())
    codes = [("killed" if p[2] is True else p[2]) or p[0].returncode for p in node.processes]
    return {
        "exit_codes": codes,
        "steps_trained": trained,
        "steps_in_final_global": in_global,
        "last_delta_in": bool(entry.get("final")) and entry.get("end_step") == fleet.plan.steps,
        "lost": {k: v for k, v in lost.items() if v},
        "downtime_s": [round(b - a, 1) for a, b in node.kills if b is not None],
    }


def final_loss(path: Path) -> tuple[float | None, str | None]:
    """The final global's held-out loss (64 sequences the nodes never train on), or why none."""
    import torch
    from safetensors.torch import load_file

    from speedtronic.data import SyntheticTokens
    from speedtronic.registry import build_model

    try:
        weights = load_file(path / "model.safetensors")
    except Exception as exc:  # noqa: BLE001 - reported, the benchmark goes on
        return None, f"not loadable: {exc}"
    if not all(bool(torch.isfinite(t).all()) for t in weights.values()):
        return None, "not finite"
    model = build_model(MODEL["name"], {k: v for k, v in MODEL.items() if k != "name"})
    missing = model.load_state_dict(weights, strict=False)
    if missing.unexpected_keys:
        return None, f"unexpected keys {missing.unexpected_keys[:3]}"
    data = SyntheticTokens(64, 32, seed=0)
    batch = [data[i] for i in range(1_000_000, 1_000_064)]
    ids, labels = (torch.stack([b[k] for b in batch]) for k in ("input_ids", "labels"))
    with torch.no_grad():
        return round(float(model(ids, labels=labels)), 4), None


def faults(log: Path) -> dict[str, int]:
    """Injected faults by kind and call (``chaos_node.FaultyTransport``'s log)."""
    found: dict[str, int] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        _, kind, call, _ = line.split(" ", 3)
        if kind == "landed":
            continue
        found[f"{kind} {call}"] = found.get(f"{kind} {call}", 0) + 1
    return dict(sorted(found.items()))


def table(runs: list[dict]) -> str:
    rows = ["| run | node | exit codes | steps trained | in final global | lost (reason: steps) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        label = "chaos" if run["chaos"] else "clean"
        for name, node in run["nodes"].items():
            lost = "; ".join(f"{k}: {v}" for k, v in node["lost"].items()) or "-"
            codes = ", ".join(map(str, node["exit_codes"]))
            rows.append(f"| {label} | {name} | {codes} | {node['steps_trained']} | "
                        f"{node['steps_in_final_global']} | {lost} |")  # fmt: skip
        faults = sum(run["faults"].values())
        rows.append(f"| {label} | final loss {run['final_loss']} | wall {run['wall_s']} s | "
                    f"faults {faults} | | {run['master_last_line']} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chaos", type=int, required=True, metavar="SEED")
    parser.add_argument("--steps", type=int, default=Plan.steps)
    parser.add_argument("--workers", type=int, default=Plan.workers)
    parser.add_argument("--kill-every", type=float, default=Plan.kill_every_s)
    parser.add_argument("--fault-rate", type=float, default=Plan.fault_rate)
    parser.add_argument("--no-clean", action="store_true", help="skip the clean run")
    parser.add_argument("--work", type=Path, help="where the runs go, a folder no earlier "
                        "run used (default: a new temp dir)")  # fmt: skip
    args = parser.parse_args()
    plan = Plan(steps=args.steps, workers=args.workers, kill_every_s=args.kill_every,
                fault_rate=args.fault_rate)  # fmt: skip
    work = args.work or Path(tempfile.mkdtemp(prefix="chaos_"))
    for part in ["chaos"] + ([] if args.no_clean else ["clean"]):
        if used(work / part, plan) is not None:  # before either run starts
            print(f"chaos.py: error: --work {work}: {used(work / part, plan)} is an earlier "
                  "run's; name a new --work (or delete that one)", file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
    runs = [] if args.no_clean else [run_fleet(work / "clean", plan, args.chaos, False)]
    runs.append(run_fleet(work / "chaos", plan, args.chaos, True))
    print(f"load average {os.getloadavg()[0]:.2f}; plan {asdict(plan)}")
    print(table(runs))
    clean, chaotic = (runs[0]["final_loss"], runs[-1]["final_loss"]) if len(runs) == 2 else (0, 0)
    ratio = round(chaotic / clean - 1, 4) if clean and chaotic else None
    print(json.dumps({"benchmark": "diloco_chaos", "seed": args.chaos, "plan": asdict(plan),
                      "loss_vs_clean": ratio, "runs": runs}))  # fmt: skip


if __name__ == "__main__":
    main()

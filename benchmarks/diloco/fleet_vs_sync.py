"""A DumbDiLoCo fleet against synchronous data parallel, real processes, equal tokens (issue 47).

Usage::

    python benchmarks/diloco/fleet_vs_sync.py                      # 2 seeds, ~10 rounds
    python benchmarks/diloco/fleet_vs_sync.py --seeds 0 --steps 2000 --arms ddp,fleet  # ~40
    python benchmarks/diloco/fleet_vs_sync.py --steps 40 --inner-steps 10 --seeds 0   # smoke

Every arm is real ``speedtronic train`` processes on the same ~0.43M-parameter
``reference_transformer`` (the convergence benchmark's), byte-level, on the Python standard
library's sources (``examples/train_text.py``'s corpus), with Muon inside and the same
hyperparameters and cosine schedule shape everywhere; ``run.seed`` comes from ``--seeds``:

- ``one``: one process, batch B, N steps;
- ``one_long``: one process, batch B, 4N steps (one machine given the fleet's tokens);
- ``ddp``: ``--nproc-per-node 4`` (gloo), B per rank (global batch 4B), N steps: synchronous
  training on the fleet's tokens;
- ``one_x2``, ``one_x3`` (not run unless named): one process, batch B, 2N / 3N steps, each
  annealed to its own horizon: with ``one`` and ``one_long`` the ladder on which the speedup is
  read (below);
- ``fleet``: DumbDiLoCo over a directory repo, a master that also trains + 3 workers, batch B,
  N steps each, the home-link settings docs/diloco.md recommends (int2 deltas with error
  feedback, an int8 global on keyframes), every other key at its default except
  ``inner_steps`` (H, ``--inner-steps``: N / 10 by default, so a run is ~10 inner loops) and
  ``poll_interval`` (0.25 s: on a directory a poll is free, and the default 60 s would be
  longer than the run).

The corpus is cut in two files: the first 95% is trained on, and the first 64 KiB of the rest is
the held-out text no arm ever sees. Scores are loss and bits per byte on it, by the product's
``speedtronic eval --text`` path: the finals by the command itself on each arm's final weights
(the fleet's: the master's ``final_global``), and along the way in-process by the same scorer
on ``ddp`` / ``one_long`` checkpoints and on every global the fleet published (a thread copies
each outer step from the repo as it appears; its tokens are ``step_count.json``'s count of what
it holds). **Only equal tokens are compared**: four processes on a 2-core machine make any
wall-clock figure meaningless, and a directory repo makes communication nearly free, so this
measures what the algorithm (async rounds, int2 deltas, an int8 global) costs against
synchronous training, not what a link costs. Prints a table and one JSON line; ``--png`` plots
held-out loss against tokens. Goal (issue 47): the fleet's final loss within +3% of ``ddp``'s
over ~10 rounds, +1% over ~40, both seeds.

**The speedup in steps** (issue 47, with the ladder arms): how many steps one process needs to
reach an arm's final loss (``speedup.time_to_reach`` on the annealed ``one`` rungs: N, 2N, 3N,
4N), over the N steps the arm's processes each took. With communication free (a directory)
and each machine as fast as the one, it is the wall-clock speedup of a fleet on a fast link:
the algorithm's share of it; ``convergence.py`` charges a home link.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "examples"))
sys.path.insert(2, str(Path(__file__).resolve().parent))
from speedup import time_to_reach  # noqa: E402

MODEL = {"name": "reference_transformer", "vocab_size": 256, "seq_len": 64, "n_layer": 2,
         "n_head": 4, "n_kv_head": 2, "d_model": 128}  # fmt: skip
NODES = ("m", "w1", "w2", "w3")  # the master trains: 4 trainers in all
HELD_OUT_BYTES = 64 * 1024
ARMS = ("one", "one_long", "ddp", "fleet")
RUNGS = {"one": 1, "one_x2": 2, "one_x3": 3, "one_long": 4}  # one process: N times this
COLORS = {"one_long": "C0", "ddp": "C1", "fleet": "C2"}


@dataclass
class Scale:
    steps: int = 500  # N
    inner_steps: int = 0  # H; 0: N / 10
    batch: int = 8  # B, sequences per process per step
    lr: float = 3.0e-3
    warmup: int = 20
    poll_s: float = 0.25
    fleet_set: dict = field(default_factory=dict)  # more distributed.* keys, for variants

    @property
    def h(self) -> int:
        return self.inner_steps or max(1, self.steps // 10)


def write_texts(work: Path) -> tuple[Path, Path]:
    """(training text, held-out text): the corpus cut at a line boundary near 95%."""
    from train_text import write_stdlib_corpus

    corpus = work / "corpus.txt"
    write_stdlib_corpus(corpus)
    data = corpus.read_bytes()
    cut = data.index(b"\n", int(len(data) * 0.95)) + 1
    train, held = work / "train.txt", work / "heldout.txt"
    train.write_bytes(data[:cut])
    tail = data[cut : cut + HELD_OUT_BYTES]
    held.write_bytes(tail[: tail.rindex(b"\n") + 1])
    corpus.unlink()
    return train, held


def config(scale: Scale, seed: int, text: Path, steps: int, world: int = 1, every: int = 0) -> dict:
    """One process's config: B per process, ``world`` processes; ``every``: steps between
    checkpoints (0: only at the end)."""
    optimizer = {"name": "muon", "muon_lr": 0.02, "lr": scale.lr, "weight_decay": 0.1,
                 "grad_clip": 1.0}  # fmt: skip
    data = {"text_path": str(text), "tokenizer": "byte", "micro_batch_size": scale.batch,
            "target_batch_size": scale.batch * world, "eval_every": 0}  # fmt: skip
    return {
        "run": {"name": "fleet-vs-sync", "seed": seed, "device": "cpu", "max_steps": steps},
        "model": MODEL,
        "data": data,
        "optimizer": optimizer,
        "scheduler": {"name": "cosine", "warmup_steps": scale.warmup, "min_lr_ratio": 0.1},
        "precision": {"mode": "fp32"},
        "checkpoint": {"interval": every, "keep_last": None},
        "logging": {"every_steps": 50},
    }


def launch(cfg: dict, out: Path, extra: list[str] = ()) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg))
    command = ["speedtronic", "train", "-c", str(path), "--output-dir", str(out), *extra]
    # one thread each: the arms must not fight over 2 cores more than they have to
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def finish(process: subprocess.Popen, out: Path) -> None:
    if process.wait() != 0:
        tail = out.with_suffix(".log").read_text().strip().splitlines()[-5:]
        raise RuntimeError(f"{out.name} exited {process.returncode}: " + " | ".join(tail))


# ---------------------------------------------------------------------- the arms


def run_plain(work: Path, scale: Scale, seed: int, text: Path, arm: str) -> Path:
    """``one``, ``one_long`` or ``ddp``; checkpoints where the fleet's rounds fall in tokens."""
    steps = scale.steps * RUNGS.get(arm, 1)
    world = 4 if arm == "ddp" else 1
    every = {"one_long": 4 * scale.h, "ddp": scale.h}.get(arm, 0)
    out = work / arm
    extra = ["--nproc-per-node", "4"] if arm == "ddp" else []
    finish(launch(config(scale, seed, text, steps, world, every), out, extra), out)
    return out


def run_fleet(work: Path, scale: Scale, seed: int, text: Path) -> tuple[Path, list[dict]]:
    """The master first (it creates the repo), the workers once it has published."""
    repo, base = work / "repo", config(scale, seed, text, scale.steps)
    processes, outs = [], [work / name for name in NODES]
    watcher = Snapshots(repo, work / "globals")
    for name, out in zip(NODES, outs, strict=True):
        cfg = {**base, "distributed": {
            "enabled": True, "role": "master" if name == "m" else "worker", "node_id": name,
            "repo_id": str(repo), "inner_steps": scale.h, "poll_interval": scale.poll_s,
            "delta_dtype": "int2", "error_feedback": True, "global_dtype": "int8",
            **scale.fleet_set}}  # fmt: skip
        processes.append(launch(cfg, out))
        while name == "m" and not (repo / "global" / "step_count.json").exists():
            if processes[0].poll() is not None:
                finish(processes[0], out)  # raises: the master ended before publishing
            time.sleep(0.1)
        if name == "m":
            watcher.start()
    try:
        for process, out in zip(processes, outs, strict=True):
            finish(process, out)
    finally:
        watcher.halt()
    watcher.look()  # the final global, should the last publish fall after the last look
    return outs[0] / "final_global", watcher.points


class Snapshots(threading.Thread):
    """Copies every outer step the repo publishes, decoded (keyframe + int8 update), with the
    tokens the global holds: the fleet's curve. A look that lands mid-publish is retried."""

    def __init__(self, repo: Path, into: Path):
        from speedtronic.distributed.global_update import GlobalReader
        from speedtronic.distributed.transport import LocalTransport
        from speedtronic.registry import build_model

        super().__init__(daemon=True)
        model = build_model(MODEL["name"], {k: v for k, v in MODEL.items() if k != "name"})
        reference = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
        self.transport = LocalTransport(repo)
        self.reader = GlobalReader(self.transport, reference)
        self.into, self.points, self.done = into, [], threading.Event()
        into.mkdir(parents=True, exist_ok=True)

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.look()

    def halt(self) -> None:
        self.done.set()
        self.join()

    def look(self) -> None:
        from safetensors.torch import save_file

        from speedtronic.distributed.protocol import fleet_totals

        try:
            count = self.transport.read_step_count() or {}
            step = count.get("outer_step")
            if step is None or any(p["outer_step"] == step for p in self.points):
                return
            read = self.reader.read(1 << 30)
        except Exception:  # noqa: BLE001 - a file replaced under us: the next look reads it
            return
        if read is None or read.outer_step != step:
            return
        path = self.into / f"outer_{step:05d}.safetensors"
        save_file(read.weights, str(path))
        tokens = fleet_totals(count.get("nodes"))["tokens"] or 0
        self.points.append({"outer_step": step, "tokens": tokens, "path": str(path)})


# ---------------------------------------------------------------------- scoring


def cli_score(run: Path, held: Path) -> dict:
    """``speedtronic eval RUN --text HELD``: the command a user runs, on the final weights."""
    done = subprocess.run(
        ["speedtronic", "eval", str(run), "--text", str(held), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    text = json.loads(done.stdout)["texts"][0]
    return {"loss": text["loss"], "bpb": text["bits_per_byte"]}


def checkpoint_curve(out: Path, held: str, tokens_per_step: int) -> list[dict]:
    """Held-out loss at every checkpoint of a run, by the eval command's own scorer."""
    from speedtronic.evaluate.runner import open_scorer
    from speedtronic.evaluate.text import score_text

    curve = []
    for ckpt in sorted((out / "checkpoints").glob("step_*")):
        run, scorer = open_scorer(ckpt, None, "cpu", 64, log=lambda _: None)
        got = score_text(scorer, run.tokenizer, held)
        curve.append({"tokens": run.step * tokens_per_step, "loss": got.loss,
                      "bpb": got.bits_per_byte})  # fmt: skip
    return curve


def fleet_curve(final: Path, points: list[dict], held: str) -> list[dict]:
    """The same scorer, its model's weights swapped for each global the fleet published."""
    from safetensors.torch import load_file

    from speedtronic.distributed.final_global import model_state
    from speedtronic.evaluate.runner import open_scorer
    from speedtronic.evaluate.text import score_text

    run, scorer = open_scorer(final, None, "cpu", 64, log=lambda _: None)
    curve = []
    for point in sorted(points, key=lambda p: p["outer_step"]):
        scorer.model.load_state_dict(model_state(scorer.model, load_file(point["path"])))
        got = score_text(scorer, run.tokenizer, held)
        curve.append({"outer_step": point["outer_step"], "tokens": point["tokens"],
                      "loss": got.loss, "bpb": got.bits_per_byte})  # fmt: skip
    return curve


def at_tokens(curve: list[dict], tokens: int) -> float | None:
    """Loss at ``tokens``, linear between the two points around it (None outside the curve)."""
    for before, after in zip(curve, curve[1:], strict=False):
        if before["tokens"] <= tokens <= after["tokens"]:
            span = after["tokens"] - before["tokens"]
            share = (tokens - before["tokens"]) / span if span else 1.0
            return before["loss"] + share * (after["loss"] - before["loss"])
    return curve[-1]["loss"] if curve and curve[-1]["tokens"] == tokens else None


# ---------------------------------------------------------------------- one seed, all seeds


def run_seed(work: Path, scale: Scale, seed: int, arms: list[str]) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    train, held = write_texts(work)
    text, per_seq = held.read_text(), MODEL["seq_len"] * scale.batch
    finals, curves, wall = {}, {}, {}
    for arm in arms:  # one at a time: the fleet's rounds depend on its nodes' pace
        began = time.monotonic()
        print(f"seed {seed}: {arm} ...", file=sys.stderr, flush=True)
        if arm == "fleet":
            final, points = run_fleet(work / "fleet", scale, seed, train)
            curves[arm] = fleet_curve(final, points, text)
            tokens = curves[arm][-1]["tokens"] if curves[arm] else None
        else:
            final = run_plain(work, scale, seed, train, arm)
            if arm in ("one_long", "ddp"):
                curves[arm] = checkpoint_curve(final, text, per_seq * (4 if arm == "ddp" else 1))
            tokens = scale.steps * per_seq * (4 if arm == "ddp" else RUNGS[arm])
        finals[arm] = {"tokens": tokens, **cli_score(final, held)}
        wall[arm] = round(time.monotonic() - began, 1)
        print(f"seed {seed}: {arm} {finals[arm]} in {wall[arm]} s", file=sys.stderr, flush=True)
    return {"seed": seed, "finals": finals, "curves": curves, "wall_s": wall,
            "marks": marks(curves, scale), "held_out_bytes": len(held.read_bytes()),
            "speedup": speedups(finals, scale)}  # fmt: skip


def speedups(finals: dict, scale: Scale) -> dict:
    """ddp's and the fleet's speedup in steps, read on the ``one`` rungs run (a bound outside
    them: ``<=`` / ``>``); empty with fewer than two rungs."""
    rungs = sorted((scale.steps * k, finals[a]["loss"]) for a, k in RUNGS.items() if a in finals)
    if len(rungs) < 2:
        return {}
    found = {arm: time_to_reach(rungs, finals[arm]["loss"]) for arm in ("ddp", "fleet")
             if arm in finals}  # fmt: skip
    return {arm: {"x": round(t / scale.steps, 3), "relation": relation}
            for arm, (t, relation) in found.items()}  # fmt: skip


def marks(curves: dict, scale: Scale) -> list[dict]:
    """At the tokens of each of ddp's checkpoints (one per inner loop of the fleet): every
    curve's loss there."""
    ddp = curves.get("ddp", [])
    loop_tokens = 4 * scale.h * scale.batch * MODEL["seq_len"]
    return [{"loops": round(p["tokens"] / loop_tokens, 2), "tokens": p["tokens"],
             **{arm: at_tokens(curve, p["tokens"]) for arm, curve in curves.items()}}
            for p in ddp]  # fmt: skip


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b - 1, 4) if a is not None and b else None


def tables(results: list[dict], every: int) -> str:
    rows = [
        "| seed | arm | tokens | held-out loss | bits per byte | vs ddp |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ddp = r["finals"].get("ddp", {}).get("loss")
        for arm, f in r["finals"].items():
            vs = ratio(f["loss"], ddp)
            rows.append(f"| {r['seed']} | {arm} | {f['tokens']:,} | {f['loss']:.4f} | "
                        f"{f['bpb']:.4f} | {'-' if vs is None else f'{vs:+.2%}'} |")  # fmt: skip
    rows += ["", "| seed | inner loops | tokens | ddp | one_long | fleet | fleet vs ddp |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        for k, m in enumerate(r["marks"], 1):
            if k % every and k != len(r["marks"]):
                continue
            cells = [f"{m[a]:.4f}" if m.get(a) is not None else "-"
                     for a in ("ddp", "one_long", "fleet")]  # fmt: skip
            vs = ratio(m.get("fleet"), m.get("ddp"))
            rows.append(
                f"| {r['seed']} | {m['loops']:g} | {m['tokens']:,} | "
                + " | ".join(cells)
                + f" | {'-' if vs is None else f'{vs:+.2%}'} |"
            )
    return "\n".join(rows)


def plot(results: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for arm, curve in r["curves"].items():
            tokens, losses = [p["tokens"] for p in curve], [p["loss"] for p in curve]
            ax.plot(tokens, losses, ".-", label=arm, color=COLORS[arm])  # same colour per arm
        if "one" in r["finals"]:
            ax.plot([r["finals"]["one"]["tokens"]], [r["finals"]["one"]["loss"]], "k*", label="one")
        ax.set(title=f"seed {r['seed']}", xlabel="tokens trained (all processes)",
               ylabel="held-out loss (nats/byte)", ylim=(None, 3.0))  # fmt: skip
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1", help="comma-separated run seeds")
    parser.add_argument("--steps", type=int, default=Scale.steps, help="N")
    parser.add_argument("--inner-steps", type=int, default=0, help="H (default N / 10)")
    parser.add_argument("--batch", type=int, default=Scale.batch, help="B")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--fleet-set", action="append", default=[], metavar="KEY=VALUE",
        help="set distributed.KEY on every fleet node (a variant); repeatable",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, help="keep every run here (default: a temp dir)")
    parser.add_argument("--png", type=Path, help="plot held-out loss against tokens")
    parser.add_argument("--out", type=Path, help="also write the JSON line here")
    args = parser.parse_args()
    fleet_set = {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in args.fleet_set)}
    scale = Scale(args.steps, args.inner_steps, args.batch, fleet_set=fleet_set)
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS) - set(RUNGS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)} (known: {', '.join({*ARMS, *RUNGS})})")
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="fleet_vs_sync_") as tmp:
        work = args.work or Path(tmp)
        results = [run_seed(work / f"seed{s}", scale, s, arms) for s in seeds]
    rounds = scale.steps / scale.h
    goal = 0.03 if rounds < 25 else 0.01
    gaps = [ratio(r["finals"].get("fleet", {}).get("loss"), r["finals"].get("ddp", {}).get("loss"))
            for r in results]  # fmt: skip
    met = all(g is not None and g <= goal for g in gaps)
    print(
        f"N {scale.steps}, H {scale.h} ({rounds:g} inner loops), B {scale.batch}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(tables(results, max(1, round(rounds / 5))))
    shown = ", ".join("-" if g is None else f"{g:+.2%}" for g in gaps)
    print(f"goal: fleet within {goal:+.0%} of ddp at equal tokens: {'met' if met else 'missed'} "
          f"({shown})")  # fmt: skip
    for r in results:
        for arm, x in r["speedup"].items():
            mark = "" if x["relation"] == "=" else x["relation"]
            print(f"seed {r['seed']}: {arm} speedup in steps {mark}{x['x']:.2f}x")
    if args.png:
        plot(results, args.png)
    line = json.dumps({"benchmark": "diloco_fleet_vs_sync", "scale": asdict(scale), "h": scale.h,
                       "goal": goal, "fleet_vs_ddp": gaps, "goal_met": met,
                       "results": results})  # fmt: skip
    print(line)
    if args.out:
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()

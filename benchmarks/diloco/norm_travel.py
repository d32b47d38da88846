"""How far honest training moves a model's L2 norm, and how far its weights travel: the margin of
the bound a DumbDiLoCo worker puts on a global's norm (docs/diloco.md, "Trust boundary").

A worker refuses a global whose norm is not within [R0 / 10, 10 (R0 + T)]: R0 its own weights'
norm at start, T the summed norms of its own deltas (its travel). This trains the reference
decoder alone under a few optimizers and reports, against R0, the largest norm reached, the
travel (a delta every ``--every`` steps), and the smallest margin of the bound over the norm
for a node at the fleet's pace (k = 1) and one that trained a tenth as far as the global moved
(k = 10). No baseline: it measures a property of training, not a speed.

Run: python benchmarks/diloco/norm_travel.py [--steps 1000] [--every 50]  (~10 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile

from speedtronic import SpeedtronicConfig
from speedtronic.runtime import train_from_config

ARMS = {
    "defaults": {},
    "lr1e-2, no weight decay, no clip": {"lr": 1e-2, "weight_decay": 0.0, "grad_clip": 0.0},
    "lr3e-2, no weight decay, no clip": {"lr": 3e-2, "weight_decay": 0.0, "grad_clip": 0.0},
}
MODEL = ["model.n_layer=4", "model.d_model=128", "model.n_head=4", "model.seq_len=64"]
MODEL += ["model.vocab_size=256", "data.micro_batch_size=16"]


class Travel:
    """A Trainer plug-in: the weights' norm and the summed norms of their moves, every ``every``."""

    name = "norm_travel"

    def __init__(self, every: int):
        self.every, self.margins = every, {1: math.inf, 10: math.inf}
        self.highest, self.travel = 1.0, 0.0

    @staticmethod
    def _weights(trainer) -> list:
        return [p.detach().double().clone() for p in trainer.model.parameters() if p.requires_grad]

    @staticmethod
    def _norm(tensors) -> float:
        return math.sqrt(sum(float(t.norm()) ** 2 for t in tensors))

    def on_train_start(self, trainer) -> None:
        self.base = self._weights(trainer)
        self.r0 = self._norm(self.base)

    def after_optimizer_step(self, trainer) -> None:
        if trainer.step % self.every:
            return
        now = self._weights(trainer)
        self.travel += self._norm([a - b for a, b in zip(now, self.base, strict=True)])
        self.base, norm = now, self._norm(now)
        self.highest = max(self.highest, norm / self.r0)
        for k in self.margins:
            bound = 10 * (self.r0 + self.travel / k)
            self.margins[k] = min(self.margins[k], bound / norm)

    def on_train_end(self, trainer, result) -> None:
        pass


def measure(name: str, optimizer: dict, steps: int, every: int, out: str) -> dict:
    overrides = [f"run.max_steps={steps}", f"run.output_dir={out}/{len(name)}", "run.device=cpu"]
    overrides += ["checkpoint.overwrite=true", "logging.every_steps=100000", *MODEL]
    overrides += [f"optimizer.{key}={value}" for key, value in optimizer.items()]
    config = SpeedtronicConfig.load(SpeedtronicConfig.default(), overrides)
    travel = Travel(every)
    result = train_from_config(config, plugins=[travel], console=False)
    return {
        "arm": name,
        "final_loss": round(result.final_loss, 3),
        "norm_max_over_r0": round(travel.highest, 2),
        "travel_over_r0": round(travel.travel / travel.r0, 2),
        "margin_k1": round(travel.margins[1], 1),
        "margin_k10": round(travel.margins[10], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        rows = [measure(n, o, args.steps, args.every, out) for n, o in ARMS.items()]
    print("| optimizer | norm, at most | travel | bound over norm (k = 1) | (k = 10) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['arm']} | {r['norm_max_over_r0']} R0 | {r['travel_over_r0']} R0 | "
            f"{r['margin_k1']}x | {r['margin_k10']}x |"
        )
    print(json.dumps({"diloco_norm_travel": rows, "steps": args.steps, "every": args.every}))


if __name__ == "__main__":
    main()

"""``--resume --rewarm N``: a new LR schedule from a checkpoint's optimizer state (issue 40).

Stdlib only. Resumed with a larger ``run.max_steps``, a finished run stays at its schedule's
final LR (``changes.py`` keeps the horizon), and ``--init-from`` starts a new schedule but
drops the optimizer's moments. A re-warm keeps all the checkpoint saved (moments, data
position, random streams, step count) and starts a schedule of its own at the resumed step:
``rewarm_steps`` of linear warmup to ``optimizer.lr`` (a new value is the new peak), then the
configured decay to the new horizon (``total_steps``, else ``run.max_steps``), the way
warmup-stable-decay runs are extended. The resumed step is recorded as
``scheduler.rewarm_from``: a later plain resume follows the same curve, and the same command
run again after an interrupt goes on with the re-warm it started instead of starting another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speedtronic.config import SpeedtronicConfig

KEYS = ("scheduler.rewarm_steps", "scheduler.rewarm_from")
# A re-warm starts the schedule anew: these may change with it (they are refused otherwise).
SCHEDULE_KEYS = {
    "scheduler.name",
    "scheduler.warmup_steps",
    "scheduler.min_lr_ratio",
    "scheduler.decay_fraction",
    "scheduler.total_steps",
}


def asked(config: SpeedtronicConfig) -> bool:
    """This resume is asked to start a re-warm (``--rewarm N``), not to follow a recorded one."""
    return bool(config.scheduler.rewarm_steps) and config.scheduler.rewarm_from is None


def start(
    saved: dict[str, Any], config: SpeedtronicConfig, step: int
) -> tuple[SpeedtronicConfig, list[str], str | None]:
    """The config with the re-warm's first step recorded, its notice, or why it cannot be."""
    steps, horizon = config.scheduler.rewarm_steps, config.schedule_steps
    if _same_rewarm(saved, steps, horizon):
        begun = saved["scheduler"]["rewarm_from"]
        config = _with(config, steps, begun)
        return (
            config,
            [f"--resume: the re-warm begun at step {begun} goes on: {_words(config, begun)}"],
            None,
        )
    if steps >= horizon - step:
        return config, [], _too_long(config, step)
    config = _with(config, steps, step)
    return config, [f"--resume: {_words(config, step)}"], None


def carry(saved: dict[str, Any], config: SpeedtronicConfig) -> SpeedtronicConfig:
    """A plain resume of a re-warmed run: the recorded re-warm goes on (its curve, not 0)."""
    sched = saved.get("scheduler") or {}
    steps, begun = sched.get("rewarm_steps"), sched.get("rewarm_from")
    if config.scheduler.rewarm_from is not None or not isinstance(begun, int):
        return config
    if not isinstance(steps, int) or steps <= 0:
        return config
    return _with(config, steps, begun)


def _same_rewarm(saved: dict[str, Any], steps: int, horizon: int) -> bool:
    """The checkpoint is inside the re-warm this very command started (rerun after a stop)."""
    sched, run = saved.get("scheduler") or {}, saved.get("run") or {}
    if not isinstance(sched.get("rewarm_from"), int) or sched.get("rewarm_steps") != steps:
        return False
    return (sched.get("total_steps") or run.get("max_steps")) == horizon


def _words(config: SpeedtronicConfig, begun: int) -> str:
    """``re-warming to lr 1.00e-03 over 100 steps (steps 1001-1100), then cosine to ...``."""
    sched, lr, horizon = config.scheduler, config.optimizer.lr, config.schedule_steps
    steps = sched.rewarm_steps
    then = f"then cosine to lr {lr * sched.min_lr_ratio:.2e} at step {horizon}"
    if sched.name == "constant":
        then = f"then constant to step {horizon}"
    elif sched.name == "wsd":
        then = f"then wsd (linear to lr {lr * sched.min_lr_ratio:.2e}) to step {horizon}"
    return (
        f"re-warming to lr {lr:.2e} over {steps} steps (steps {begun + 1}-{begun + steps}), "
        f"{then} (scheduler.rewarm_steps); the optimizer's state, data position and random "
        "streams carry on"
    )


def _too_long(config: SpeedtronicConfig, step: int) -> str:
    horizon, steps = config.schedule_steps, config.scheduler.rewarm_steps
    end = "scheduler.total_steps" if config.scheduler.total_steps else "run.max_steps"
    left = max(0, horizon - step)
    return (
        f"scheduler.rewarm_steps: must be less than the {left} steps left after the "
        f"checkpoint's step {step} ({end} {horizon}) (got {steps})"
    )


def hint(config: SpeedtronicConfig) -> str:
    end = "scheduler.total_steps" if config.scheduler.total_steps else "run.max_steps (--max-steps)"
    return f"re-warm over fewer steps, or extend the run: a larger {end}"


def _with(config: SpeedtronicConfig, steps: int, begun: int) -> SpeedtronicConfig:
    raw = config.to_dict(redact=False)
    raw["scheduler"].update(rewarm_steps=steps, rewarm_from=begun)
    return type(config).from_dict(raw)

"""What ``--resume`` does with a config that differs from the checkpoint's (issue 31). Stdlib only.

A resumed run used to take any new config without a word: a new ``optimizer.lr`` was not
applied (the optimizer's saved state brought the old one back) yet meta.json recorded it, a
new data file was read at the old run's data position, and a longer ``max_steps`` re-stretched
the cosine so the learning rate jumped back up. ``reconcile`` compares the new config with the
one the checkpoint recorded, key by key, and sorts every difference:

- **applied** from the next step (the optimizer's settings, ``max_steps``, logging, the eval
  cadence, device, precision, compile, checkpoint cadence, ...), each named in one line;
- **refused**, with the way to do it instead: what defines the run's model, data, data order,
  batch layout, schedule or DumbDiLoCo identity. The saved state (weights, data position,
  schedule step) means nothing under another value. The whole list is one ConfigError, and
  nothing has been written yet.

The schedule rule: the schedule's horizon (``scheduler.total_steps``, default ``run.max_steps``)
is the one the run started with. A longer ``max_steps`` keeps it, so the LR follows the same
curve to the original end and then stays at the schedule's final value: it never jumps back
up. The config the run goes on with records that horizon explicitly, so meta.json holds only
values that were applied. A new schedule from the saved optimizer state is a re-warm
(``--rewarm N``, ``rewarm.py``): then the schedule's keys and horizon may change; a new
schedule with a fresh optimizer is a new run: ``--init-from`` (weights only).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from speedtronic.checkpoint import rewarm, run_end
from speedtronic.errors import ConfigError

if TYPE_CHECKING:
    from speedtronic.config import SpeedtronicConfig

# Never compared: how this command was started, and a secret stored redacted.
IGNORED = {
    "checkpoint.resume",
    "checkpoint.overwrite",
    "checkpoint.init_from",
    "checkpoint.init_overrides",
    "checkpoint.allow_tokenizer_mismatch",
    "distributed.token",
    *rewarm.KEYS,  # a re-warm is asked for (or carried over) by rewarm.py, never compared
    *run_end.KEYS,  # recorded by run_end.py when a budgeted run's end changes
    run_end.KEEP,
}
_DATA = "the saved data position indexes the data the run was reading"
_ORDER = "the saved data position counts along the run's data order"
_LAYOUT = "the saved data position and step counters count batches of the run's layout"
_SCHEDULE = "the LR schedule is the run's own: another one would make the LR jump"
_NODE = "it is this node's place in the DumbDiLoCo run"
# key -> why it cannot change within a run. Every model.* key is refused too (its shape).
REFUSED = {
    "run.seed": "it set the initial weights and, unless data.seed is set, the data order",
    "optimizer.name": "the optimizer's saved state belongs to the optimizer that wrote it",
    "data.source": _DATA,
    "data.text_path": _DATA,
    "data.token_path": _DATA,
    "data.token_dtype": _DATA,
    "data.tokenizer": _DATA,
    "data.eval_fraction": "it moves the end of the training data",
    "data.shuffle": _ORDER,
    "data.seed": _ORDER,
    "data.shuffle_buffer": _ORDER,
    "data.micro_batch_size": _LAYOUT,
    "data.target_batch_size": _LAYOUT,
    "data.seq_len": _LAYOUT,
    "scheduler.name": _SCHEDULE,
    "scheduler.warmup_steps": _SCHEDULE,
    "scheduler.min_lr_ratio": _SCHEDULE,
    "distributed.enabled": _NODE,
    "distributed.mode": _NODE,
    "distributed.role": _NODE,
    "distributed.node_id": _NODE,
    "distributed.repo_id": _NODE,
    "distributed.path": _NODE,
    "distributed.endpoint_url": _NODE,
    "distributed.state_dir": _NODE,
    "distributed.inner_steps": _NODE,
    "distributed.train_locally": _NODE,
    "distributed.delta_dtype": _NODE,
    "distributed.error_feedback": _NODE,
}
_PATHS = {"data.text_path", "data.token_path", "data.eval_path", "data.tokenizer"}


def reconcile(
    saved: dict[str, Any] | None,
    config: SpeedtronicConfig,
    step: int,
    where: str,
    seconds: float = 0.0,
    lr_factor: float | None = None,
) -> tuple[SpeedtronicConfig, list[str]]:
    """The config to resume with, and one notice per applied change.

    ``saved`` is the config the checkpoint at ``where`` recorded (meta.json), ``step`` its
    step, ``seconds`` its training seconds and ``lr_factor`` its LR as a share of the base LR
    (for a time budget's end: ``run_end``). Raises a ConfigError listing every refused change
    (each one line) with how to do it instead.
    """
    if not isinstance(saved, dict):
        return config, ["--resume: the checkpoint records no config; nothing compared"]
    old, new = flatten(saved), flatten(json.loads(json.dumps(config.to_dict(redact=True))))
    changed = [k for k in sorted(old.keys() & new.keys()) if not _same(k, old[k], new[k])]
    changed += sorted(k for k in old.keys() ^ new.keys() if k.startswith("model."))
    rewarming = rewarm.asked(config)
    free = rewarm.SCHEDULE_KEYS if rewarming else set()
    refused = [k for k in changed if _why_refused(k, config) and k not in free]
    problems = [
        f"--resume: {k}: {_shown(old.get(k))} -> {_shown(new.get(k))} cannot change within a "
        f"run: {_why_refused(k, config)}"
        for k in refused
    ]
    if rewarming:
        config, horizon_notes, problem = rewarm.start(saved, config, step)
    elif run_end.involved(saved, config):
        config = run_end.carry(saved, config)
        config, horizon_notes, problem = run_end.settle(saved, config, step, seconds, lr_factor)
        # a kept budget is no change: only what the run goes on with is named
        changed = [
            k for k in changed if k not in old or not _same(k, old[k], _flat_value(config, k))
        ]
    else:
        config = rewarm.carry(saved, run_end.carry(saved, config))
        config, horizon_notes, problem = _freeze_horizon(saved, config, step)
    problems += [problem] if problem else []
    if problems:
        hint = _refusal_hint(refused, where, str(config.output_dir))
        hint = rewarm.hint(config) if rewarming and not refused else hint
        raise ConfigError(problems[0], hint=hint, problems=problems)
    notes = [
        f"--resume: {k}: {_shown(old[k])} -> {_shown(new[k])}, applied from step {step + 1}"
        for k in changed
        if k not in ("run.max_steps", "scheduler.total_steps")
    ]
    return config, notes + horizon_notes


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """``{"optimizer": {"lr": 1}}`` -> ``{"optimizer.lr": 1}``; top-level scalars stay."""
    flat: dict[str, Any] = {}
    for section, values in config.items():
        if isinstance(values, dict):
            flat.update({f"{section}.{key}": value for key, value in values.items()})
        else:
            flat[section] = values
    lora = flat.pop("model.lora", None)  # each setting its own line: model.lora.r: 8 -> 16
    if isinstance(lora, dict):
        flat.update({f"model.lora.{key}": value for key, value in lora.items()})
    elif lora is not None:
        flat["model.lora"] = lora
    return {k: v for k, v in flat.items() if k not in IGNORED}


def _flat_value(config: SpeedtronicConfig, key: str) -> Any:
    section, _, name = key.partition(".")
    values = config.to_dict(redact=True).get(section)
    return values.get(name) if isinstance(values, dict) else values


def _same(key: str, old: Any, new: Any) -> bool:
    if old == new:
        return True
    if key in _PATHS and isinstance(old, str) and isinstance(new, str):
        return os.path.realpath(old) == os.path.realpath(new)  # ./a.txt and a.txt
    return False


def _why_refused(key: str, config: SpeedtronicConfig) -> str | None:
    if key.startswith("model.lora"):
        return "the checkpoint's adapters are of the LoRA settings that trained them"
    if key.startswith("model."):
        return "the checkpoint's weights have the shape of the model that wrote them"
    if key == "data.num_workers" and _streamed(config):
        return "a streamed text source deals its segments out by worker"
    return REFUSED.get(key)


def _streamed(config: SpeedtronicConfig) -> bool:
    return config.data.resolved_source == "text" and config.data.tokenizer != "byte"


def _freeze_horizon(
    saved: dict[str, Any], config: SpeedtronicConfig, step: int
) -> tuple[SpeedtronicConfig, list[str], str | None]:
    """Keep the schedule's horizon the run started with (see the module docstring)."""
    sched, run = saved.get("scheduler") or {}, saved.get("run") or {}
    horizon = sched.get("total_steps") or run.get("max_steps")
    if not isinstance(horizon, int):
        return config, [], None
    asked = config.scheduler.total_steps
    if asked is not None and asked != horizon:
        problem = (
            f"--resume: scheduler.total_steps: {horizon} -> {asked} cannot change within a "
            f"run: {_SCHEDULE}"
        )
        return config, [], problem
    notes = []
    old_max, new_max = run.get("max_steps"), config.run.max_steps
    if old_max != new_max:
        words = _horizon_words(config, horizon)
        notes.append(f"--resume: run.max_steps: {_shown(old_max)} -> {new_max}, applied; {words}")
    if asked is None and horizon != config.run.max_steps:
        config = with_value(config, "scheduler.total_steps", horizon)
    return config, notes, None


def _horizon_words(config: SpeedtronicConfig, horizon: int) -> str:
    """What the frozen horizon means for a run that now ends at ``config.run.max_steps``."""
    end = config.run.max_steps
    if end <= horizon:
        return f"the LR schedule keeps its horizon of {horizon} steps"
    lr = config.optimizer.lr
    final = lr if config.scheduler.name == "constant" else lr * config.scheduler.min_lr_ratio
    return (
        f"the LR schedule keeps its horizon of {horizon} steps (scheduler.total_steps), so "
        f"steps {horizon + 1}-{end} train at its final LR {final:.2e}"
    )


def with_value(config: SpeedtronicConfig, key: str, value: Any) -> SpeedtronicConfig:
    """A copy of ``config`` with one ``section.key`` set (validated like any config)."""
    raw = config.to_dict(redact=False)
    section, name = key.split(".")
    raw[section][name] = value
    return type(config).from_dict(raw)


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refusal_hint(refused: list[str], where: str, run_dir: str) -> str:
    values = f'resume with the checkpoint\'s values (the "config" of {where}/meta.json)'
    if any(k.startswith("model.") for k in refused):
        return f"{values}, or train the new model as a new run (--output-dir NEW_DIR)"
    return (
        f"{values}, or start a new run from its weights: --init-from {run_dir} --output-dir "
        "NEW_DIR (a fresh optimizer, schedule and step count)"
    )

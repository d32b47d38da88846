"""From plain data to typed sections: strict type matching, ranges and every check.

Owns the step after parsing: each section's mapping becomes its dataclass, each value is
matched exactly against the field's annotation (ints widen to floats, nothing else converts),
then held to what a run can use: floats finite, strings free of NUL, numbers in the field's
declared range, then each section's own checks. Problems are collected, not raised, so a
user sees all of them at once. Also owns the reference model's ``seq_len`` / ``max_seq_len``
alias and ``check_types`` for plug-ins that validate their own dataclasses.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, Union

from speedtronic.config.messages import brief, describe, key_text, summary, unknown
from speedtronic.config.rules import Range
from speedtronic.config.sections import (
    RUN_ALIASES,
    SCALARS,
    SECTIONS,
    LoraConfig,
    ModelConfig,
)
from speedtronic.errors import ConfigError

INVALID = object()  # a value that failed its type check; the field keeps its default
REFERENCE = "reference_transformer"
REFERENCE_SEQ_LEN = Range.parse("[1, 2**20]")  # RoPE tables and masks are sized to it


def build_sections(raw: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Keyword arguments for ``SpeedtronicConfig``; what is wrong is appended to ``problems``."""
    raw = _gather_run_aliases(dict(raw), problems)
    if isinstance(raw.get("precision"), str):  # shorthand: `precision: bf16`
        raw["precision"] = {"mode": raw["precision"]}
    known = [*SECTIONS, *SCALARS, *RUN_ALIASES]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECTIONS:
            kwargs[key] = _build_section(key, value, problems)
        elif key in SCALARS:
            kwargs[key] = coerce(key, value, bool, problems)
        else:
            problems.append(unknown(key_text(key), key, known))
    return {k: v for k, v in kwargs.items() if v is not None and v is not INVALID}


def _gather_run_aliases(raw: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    run = raw.get("run")
    run_raw = dict(run) if isinstance(run, dict) else {}
    for alias in RUN_ALIASES:
        if alias in raw:
            if alias in run_raw:
                problems.append(f"{alias}: given both at top level and as run.{alias}; keep one")
            run_raw[alias] = raw.pop(alias)
    if run_raw:
        if run is not None and not isinstance(run, dict):  # about to be replaced: say so now
            problems.append(f"run: must be a mapping (got {describe(run)})")
        raw["run"] = run_raw
    return raw


def check_sections(config: Any) -> list[str]:
    """Ranges, then each section's own checks.

    A field that failed its type or its range holds its default by the time the section's
    own checks run, so those never compute with (or print) a value already reported.
    """
    problems: list[str] = []
    for name in SECTIONS:
        section = getattr(config, name)
        problems.extend(_range_problems(name, section))
        check = getattr(section, "check", None)
        problems.extend(check() if check else [])
    return (
        problems
        + _check_context_length(config)
        + _check_eval_cadence(config)
        + _check_rewarm(config)
        + _check_lora(config)
    )


def _check_lora(config: Any) -> list[str]:
    """LoRA adapts a trained model: it needs one to start from, and AdamW to train it."""
    if config.model.lora is None:
        return []
    problems = []
    if not config.checkpoint.init_from and not config.checkpoint.resume:
        problems.append(
            "model.lora: needs --init-from (checkpoint.init_from): LoRA trains adapters on a "
            "trained model's frozen weights; name the run or transformers model to adapt"
        )
    if config.optimizer.name == "muon":
        problems.append(
            "optimizer.name: muon not with model.lora: Muon orthogonalises whole weight "
            "matrices, not a rank-r factor of an update; use adamw (peft's and litgpt's choice)"
        )
    return problems


def _range_problems(name: str, section: Any) -> list[str]:
    problems = []
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        rng, value = f.metadata.get("range"), getattr(section, f.name)
        if rng is not None and value is not None and value not in rng:
            rule = rng.rule(_nullable(hints[f.name]))
            problems.append(f"{name}.{f.name}: must be {rule} (got {brief(value)})")
            setattr(section, f.name, f.default)
    return problems


def _check_context_length(config: Any) -> list[str]:
    """The reference model rejects inputs longer than its context only at the first step."""
    model_len, data_len = config.model.params.get("seq_len"), config.data.seq_len
    if config.model.name != REFERENCE or not (_is_int(model_len) and _is_int(data_len)):
        return []
    if model_len not in REFERENCE_SEQ_LEN:  # reported already
        return []
    if data_len <= model_len:
        return []
    return [
        f"data.seq_len: must be <= model.seq_len={model_len}, the reference model's context "
        f"length (got {data_len})"
    ]


def _check_rewarm(config: Any) -> list[str]:
    """A re-warm starts from a checkpoint's optimizer state: only a resume has one."""
    sched = config.scheduler
    if sched.rewarm_steps and config.run.time_budget_s is not None:
        return [
            "scheduler.rewarm_steps: not with run.time_budget_s: a budgeted run's schedule "
            f"follows its seconds, a re-warm its steps (got {sched.rewarm_steps})"
        ]
    if not sched.rewarm_steps or sched.rewarm_from is not None or config.checkpoint.resume:
        return []
    return [
        f"scheduler.rewarm_steps: needs checkpoint.resume: true (--resume): a re-warm starts a "
        f"new schedule from a checkpoint's optimizer state (got {sched.rewarm_steps})"
    ]


def _check_eval_cadence(config: Any) -> list[str]:
    if config.eval.sets and not (config.eval.every or config.data.eval_every):
        return ["eval.sets: needs eval.every or data.eval_every > 0 (when to score them)"]
    return []


# ---- sections -----------------------------------------------------------------------------


def _build_section(name: str, value: Any, problems: list[str]) -> Any:
    cls = SECTIONS[name]
    if value is None:
        return cls()
    if not isinstance(value, dict):
        problems.append(f"{name}: must be a mapping (got {describe(value)})")
        return None
    if name == "model":
        return _build_model(value, problems)
    return _build_fields(name, cls, value, problems)


def _build_fields(name: str, cls: type, value: dict[str, Any], problems: list[str]) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, item in value.items():
        if key not in fields:
            problems.append(unknown(f"{name}.{key_text(key)}", str(key), list(fields)))
            continue
        rng = fields[key].metadata.get("range")
        coerced = coerce(f"{name}.{key}", item, hints[key], problems, rng)
        if coerced is not INVALID:
            kwargs[key] = coerced
    return cls(**kwargs)


def _build_model(value: dict[str, Any], problems: list[str]) -> ModelConfig:
    params = dict(value)
    name = coerce("model.name", params.pop("name", ModelConfig.name), str, problems)
    imports = coerce("model.imports", params.pop("imports", []), list[str], problems)
    lora = _build_lora(params.pop("lora", None), problems)
    bad = [k for k in params if not isinstance(k, str) or not k.isidentifier()]
    for key in bad:
        problems.append(f"model.{key_text(key)}: parameter names must be Python identifiers")
    if name is INVALID or imports is INVALID:
        return ModelConfig()
    if name == REFERENCE:
        params = _reference_params(params, problems)
    return ModelConfig(name=name, imports=imports, params=params, lora=lora)


def _build_lora(value: Any, problems: list[str]) -> LoraConfig | None:
    """``model.lora``: a section of its own inside ``model`` (null or absent: no adapters)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(
            f"model.lora: must be a mapping of r, alpha, dropout, target_modules "
            f"(got {describe(value)})"
        )
        return None
    lora = _build_fields("model.lora", LoraConfig, value, problems)
    problems.extend(_range_problems("model.lora", lora))
    return lora


def _reference_params(params: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Accept ``max_seq_len`` as the reference model's ``seq_len``, and bound it at load."""
    if "max_seq_len" in params:
        if "seq_len" in params and params["seq_len"] != params["max_seq_len"]:
            problems.append(
                "model.max_seq_len: an alias of model.seq_len; set one of them (got seq_len="
                f"{brief(params['seq_len'])} and max_seq_len={brief(params['max_seq_len'])})"
            )
            return params
        # Rebuild in order, so to_dict() shows seq_len where the user wrote max_seq_len
        params = {("seq_len" if k == "max_seq_len" else k): v for k, v in params.items()}
        key = "model.max_seq_len"
    else:
        key = "model.seq_len"
    if "seq_len" in params:
        length = coerce(key, params["seq_len"], int, problems, REFERENCE_SEQ_LEN)
        if length is not INVALID and length not in REFERENCE_SEQ_LEN:
            problems.append(f"{key}: must be {REFERENCE_SEQ_LEN.rule()} (got {brief(length)})")
    return params


# ---- type matching ------------------------------------------------------------------------


def check_types(section: str, cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Type-check ``values`` against the dataclass ``cls``'s annotations (for plug-in sections)."""
    problems: list[str] = []
    hints = typing.get_type_hints(cls)
    out = {k: coerce(f"{section}.{k}", v, hints[k], problems) for k, v in values.items()}
    if problems:
        raise ConfigError(summary(problems), problems=problems)
    return out


def coerce(path: str, value: Any, hint: Any, problems: list[str], rng: Range | None = None) -> Any:
    """Return ``value`` if it matches ``hint`` exactly (ints widen to floats), else record why.

    A match must also be usable: floats finite (``1e999`` parses as inf) and strings free of
    NUL, which no path or name survives. ``rng`` only words that message; ranges are checked
    once the section is built.
    """
    ok, result = _match(value, hint)
    if not ok:
        problems.append(f"{path}: must be {_type_name(hint)} (got {describe(value)})")
        return INVALID
    flaw = _flaw(result)
    if flaw:
        rule = f" and {rng.rule(_nullable(hint))}" if rng else ""
        shown = brief(value) if isinstance(value, (list, tuple)) else describe(value)
        problems.append(f"{path}: must be {flaw}{rule} (got {shown})")
        return INVALID
    return result


def _flaw(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return "finite"
    if isinstance(value, str) and "\x00" in value:
        return "free of NUL characters"
    if isinstance(value, (list, tuple)):
        return next((flaw for flaw in map(_flaw, value) if flaw), None)
    return None


def _match(value: Any, hint: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        for arg in args:
            ok, result = _match(value, arg)
            if ok:
                return True, result
        return False, None
    if origin is Literal:
        return (isinstance(value, str) and value in args), value
    if hint is type(None):
        return value is None, None
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return _is_int(value), value
    if hint is float:
        return _match_float(value)
    if hint is str:
        return isinstance(value, str), value
    if origin in (list, tuple):
        return _match_items(value, origin, args)
    raise TypeError(f"unsupported config type {hint!r}")  # internal: a new field type


def _match_float(value: Any) -> tuple[bool, Any]:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False, None
    try:
        return True, float(value)
    except OverflowError:  # an int beyond the float range: a number, but not a finite one
        return True, math.inf if value > 0 else -math.inf


def _match_items(value: Any, origin: Any, args: tuple[Any, ...]) -> tuple[bool, Any]:
    if not isinstance(value, (list, tuple)):
        return False, None
    item_hints = args if origin is tuple else (args[0],) * len(value)
    if len(item_hints) != len(value):
        return False, None
    matched = [_match(v, h) for v, h in zip(value, item_hints, strict=True)]
    if not all(ok for ok, _ in matched):
        return False, None
    items = [r for _, r in matched]
    return True, tuple(items) if origin is tuple else items


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _nullable(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    plural = {float: "numbers", int: "integers", str: "strings", bool: "booleans"}
    if origin is tuple:
        return f"a list of {len(args)} {plural[args[0]]}"
    if origin is list:
        return f"a list of {plural[args[0]]}"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, "null" if hint is type(None) else str(hint))

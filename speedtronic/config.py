"""SpeedtronicConfig: the one object that drives a run.

Owns the config sections (dataclasses), loading from a dict / YAML / JSON (file or string),
strict validation with messages that name the key path, CLI overrides (``--set a.b=value``)
and secret redaction. Pure Python + PyYAML: importing this module never imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from speedtronic.errors import ConfigError

REDACTED = "<redacted>"
NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass
class RunConfig:
    name: str = "speedtronic"
    seed: int = 0
    device: str = "auto"
    max_steps: int = 100
    output_dir: str | None = None  # None -> runs/<name>

    def check(self) -> list[str]:
        problems = []
        if not re.match(r"^(auto|cpu|mps|cuda(:\d+)?)$", self.device):
            problems.append(
                f"run.device: must be auto, cpu, cuda, cuda:N or mps (got {self.device!r})"
            )
        if self.max_steps < 1:
            problems.append(f"run.max_steps: must be >= 1 (got {self.max_steps})")
        if not self.name.strip():
            problems.append("run.name: must not be empty")
        return problems


@dataclass
class ModelConfig:
    """``name`` is a registered model or an import path ``package.module:factory``.

    Every other key in the YAML section is passed to the model factory as a keyword.
    """

    name: str = "reference_transformer"
    imports: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    source: Literal["auto", "synthetic", "text", "tokens"] = "auto"  # auto: from the paths set
    text_path: str | None = None  # a UTF-8 text file, streamed
    token_path: str | None = None  # a flat uint16/uint32 token file, memory-mapped
    token_dtype: Literal["auto", "uint16", "uint32"] = "auto"  # auto: uint16 if vocab <= 65536
    tokenizer: str = "byte"  # or the path of a Hugging Face tokenizers JSON file
    micro_batch_size: int = 8
    target_batch_size: int | None = None  # None -> micro_batch_size (no accumulation)
    seq_len: int | None = None  # None -> model.seq_len, else 128
    num_workers: int = 0
    prefetch_factor: int = 2
    pin_memory: bool | Literal["auto"] = "auto"
    shuffle: bool = True
    shuffle_buffer: int = 1024  # blocks, for streamed text with a non-byte tokenizer
    eval_path: str | None = None  # held-out file of the same kind as the training source
    eval_fraction: float = 0.0  # or hold out this share of the training file's end
    eval_every: int = 0  # optimizer steps between evaluations; 0 -> never
    eval_batches: int = 8

    @property
    def resolved_source(self) -> str:
        if self.source != "auto":
            return self.source
        return "text" if self.text_path else "tokens" if self.token_path else "synthetic"

    def check(self) -> list[str]:
        problems = []
        for key in (
            "micro_batch_size",
            "target_batch_size",
            "seq_len",
            "prefetch_factor",
            "eval_batches",
        ):
            value = getattr(self, key)
            if value is not None and value < 1:
                problems.append(f"data.{key}: must be >= 1 (got {value})")
        for key in ("num_workers", "eval_every", "shuffle_buffer"):
            if getattr(self, key) < 0:
                problems.append(f"data.{key}: must be >= 0 (got {getattr(self, key)})")
        target = self.target_batch_size
        if target and self.micro_batch_size >= 1 and target % self.micro_batch_size:
            problems.append(
                f"data.target_batch_size: must be a multiple of data.micro_batch_size="
                f"{self.micro_batch_size} so gradient accumulation divides evenly (got {target})"
            )
        return problems + self._check_sources()

    def _check_sources(self) -> list[str]:
        problems = []
        source = self.resolved_source
        if self.text_path and self.token_path:
            problems.append("data: set text_path or token_path, not both")
        if source == "text" and not self.text_path:
            problems.append("data.text_path: required when data.source is 'text'")
        if source == "tokens" and not self.token_path:
            problems.append("data.token_path: required when data.source is 'tokens'")
        if not 0 <= self.eval_fraction < 1:
            problems.append(f"data.eval_fraction: must be in [0, 1) (got {self.eval_fraction})")
        has_eval = self.eval_path or self.eval_fraction > 0
        if self.eval_every and not has_eval:
            problems.append("data.eval_every: needs data.eval_path or data.eval_fraction > 0")
        if has_eval and source == "synthetic":
            problems.append(
                "data.eval_path / eval_fraction: need a text or token file source "
                "(data.text_path or data.token_path)"
            )
        if self.eval_path and self.eval_fraction:
            problems.append("data: set eval_path or eval_fraction, not both")
        return problems


@dataclass
class OptimizerConfig:
    name: Literal["adamw"] = "adamw"
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool | Literal["auto"] = "auto"
    grad_clip: float | None = 1.0  # None or 0 disables clipping

    def check(self) -> list[str]:
        problems = []
        if self.lr <= 0:
            problems.append(f"optimizer.lr: must be > 0 (got {self.lr})")
        if not all(0 <= b < 1 for b in self.betas):
            problems.append(f"optimizer.betas: each must be in [0, 1) (got {list(self.betas)})")
        if self.eps <= 0:
            problems.append(f"optimizer.eps: must be > 0 (got {self.eps})")
        if self.weight_decay < 0:
            problems.append(f"optimizer.weight_decay: must be >= 0 (got {self.weight_decay})")
        if self.grad_clip is not None and self.grad_clip < 0:
            problems.append(f"optimizer.grad_clip: must be >= 0 (got {self.grad_clip})")
        return problems


@dataclass
class SchedulerConfig:
    name: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    total_steps: int | None = None  # None -> run.max_steps

    def check(self) -> list[str]:
        problems = []
        if self.warmup_steps < 0:
            problems.append(f"scheduler.warmup_steps: must be >= 0 (got {self.warmup_steps})")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"scheduler.min_lr_ratio: must be in [0, 1] (got {self.min_lr_ratio})")
        if self.total_steps is not None and self.total_steps < 1:
            problems.append(f"scheduler.total_steps: must be >= 1 (got {self.total_steps})")
        return problems


@dataclass
class PrecisionConfig:
    mode: Literal["auto", "bf16", "fp16", "fp32"] = "auto"


@dataclass
class CheckpointConfig:
    directory: str | None = None  # None -> <output_dir>/checkpoints
    interval: int = 0  # optimizer steps between checkpoints; 0 -> only at the end
    keep_last: int | None = 3
    resume: bool = False

    def check(self) -> list[str]:
        problems = []
        if self.interval < 0:
            problems.append(f"checkpoint.interval: must be >= 0 (got {self.interval})")
        if self.keep_last is not None and self.keep_last < 1:
            problems.append(f"checkpoint.keep_last: must be >= 1 or null (got {self.keep_last})")
        return problems


@dataclass
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    file: str | None = None
    json_file: str | None = None
    every_steps: int = 10
    hooks: list[str] = field(default_factory=list)  # tensorboard, wandb, "package.module:attr"

    def check(self) -> list[str]:
        if self.every_steps < 1:
            return [f"logging.every_steps: must be >= 1 (got {self.every_steps})"]
        return [
            f"logging.hooks: {h!r} must be tensorboard, wandb or an import path "
            "'package.module:attribute'"
            for h in self.hooks
            if h not in ("tensorboard", "wandb") and not re.match(r"^[\w.]+:[\w.]+$", h)
        ]


@dataclass
class DistributedConfig:
    """DumbDiLoCo settings. Validated here; the behaviour lives in ``speedtronic.distributed``."""

    enabled: bool = False
    role: Literal["worker", "master"] = "worker"
    node_id: str | None = None
    repo_id: str | None = None  # Hugging Face Hub repo shared by all nodes
    path: str | None = None  # or a shared directory instead of the Hub
    token: str | None = field(default=None, repr=False)
    inner_steps: int = 100
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    min_deltas: int = 1
    max_wait_s: float = 600.0
    max_staleness: int = 4
    delta_dtype: Literal["fp32", "bf16", "int8"] = "bf16"

    def check(self) -> list[str]:
        problems = []
        if self.node_id is not None and not NODE_ID_RE.match(self.node_id):
            problems.append(
                "distributed.node_id: must be 1-64 characters of letters, digits, '_', '.', '-' "
                f"starting with a letter or digit (got {self.node_id!r})"
            )
        for key in ("inner_steps", "min_deltas"):
            if getattr(self, key) < 1:
                problems.append(f"distributed.{key}: must be >= 1 (got {getattr(self, key)})")
        if self.outer_lr <= 0:
            problems.append(f"distributed.outer_lr: must be > 0 (got {self.outer_lr})")
        if not 0 <= self.outer_momentum < 1:
            problems.append(
                f"distributed.outer_momentum: must be in [0, 1) (got {self.outer_momentum})"
            )
        if self.max_staleness < 0 or self.max_wait_s < 0:
            problems.append("distributed.max_staleness and max_wait_s: must be >= 0")
        if self.enabled and not (self.repo_id or self.path):
            problems.append("distributed: set repo_id (a Hub repo) or path (a shared directory)")
        if self.enabled and self.role == "worker" and not self.node_id:
            problems.append("distributed.node_id: required for a worker")
        return problems


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "scheduler": SchedulerConfig,
    "precision": PrecisionConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "distributed": DistributedConfig,
}
SCALARS = {"compile": False, "gradient_checkpointing": False}
RUN_ALIASES = ("name", "max_steps", "output_dir", "seed", "device")


@dataclass
class SpeedtronicConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    compile: bool = False
    gradient_checkpointing: bool = False
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    # ---- loading -------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], overrides: list[str] | None = None
    ) -> SpeedtronicConfig:
        """Validate a plain dict (as parsed from YAML/JSON); a ConfigError lists every problem."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config: must be a mapping of sections (got {type(raw).__name__})")
        raw = apply_overrides(raw, overrides or [])
        problems: list[str] = []
        config = _build(raw, problems)
        if problems:
            raise ConfigError(_summary(problems), problems=problems)
        return config

    @classmethod
    def from_yaml(cls, text: str, overrides: list[str] | None = None) -> SpeedtronicConfig:
        """Parse a YAML (or JSON, a subset of YAML) string."""
        return cls.from_dict(parse_yaml(text, "config"), overrides)

    @classmethod
    def from_file(cls, path: str | Path, overrides: list[str] | None = None) -> SpeedtronicConfig:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        return cls.from_dict(parse_yaml(text, str(path)), overrides)

    @classmethod
    def load(cls, source: Any, overrides: list[str] | None = None) -> SpeedtronicConfig:
        """One loader: a SpeedtronicConfig, a dict, a path, or a YAML/JSON string."""
        if isinstance(source, SpeedtronicConfig):
            return cls.from_dict(source.to_dict(redact=False), overrides)
        if isinstance(source, dict):
            return cls.from_dict(source, overrides)
        if isinstance(source, Path) or (isinstance(source, str) and _looks_like_path(source)):
            return cls.from_file(source, overrides)
        if isinstance(source, str):
            return cls.from_yaml(source, overrides)
        raise ConfigError(f"config: cannot load from {type(source).__name__}")

    @classmethod
    def default(cls) -> SpeedtronicConfig:
        """The embedded default run (the packaged smoke config)."""
        return cls.from_yaml(default_config_text())

    # ---- output --------------------------------------------------------------------
    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "model":
                out["model"] = {"name": value.name, "imports": list(value.imports), **value.params}
            elif dataclasses.is_dataclass(value):
                out[f.name] = {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
            else:
                out[f.name] = value
        if redact and out["distributed"].get("token"):
            out["distributed"]["token"] = REDACTED
        return out

    def to_yaml(self) -> str:
        """Redacted YAML, safe to print or store."""
        return yaml.safe_dump(self.to_dict(redact=True), sort_keys=False)

    # ---- derived facts -------------------------------------------------------------
    @property
    def accumulation_steps(self) -> int:
        target = self.data.target_batch_size or self.data.micro_batch_size
        return target // self.data.micro_batch_size

    @property
    def batch_size(self) -> int:
        return self.data.micro_batch_size * self.accumulation_steps

    @property
    def seq_len(self) -> int:
        return int(self.data.seq_len or self.model.params.get("seq_len") or 128)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def output_dir(self) -> Path:
        return Path(self.run.output_dir or Path("runs") / self.run.name)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.directory or self.output_dir / "checkpoints")

    @property
    def schedule_steps(self) -> int:
        return self.scheduler.total_steps or self.run.max_steps


# ---- building and type checking ---------------------------------------------------------


def _build(raw: dict[str, Any], problems: list[str]) -> SpeedtronicConfig:
    raw = dict(raw)
    run_raw = raw.get("run") or {}
    if not isinstance(run_raw, dict):
        run_raw = {}
    run_raw = dict(run_raw)
    for alias in RUN_ALIASES:
        if alias in raw:
            if alias in run_raw:
                problems.append(f"{alias}: given both at top level and as run.{alias}; keep one")
            run_raw[alias] = raw.pop(alias)
    if run_raw:
        raw["run"] = run_raw
    if isinstance(raw.get("precision"), str):  # shorthand: `precision: bf16`
        raw["precision"] = {"mode": raw["precision"]}

    known = [*SECTIONS, *SCALARS, *RUN_ALIASES]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECTIONS:
            kwargs[key] = _build_section(key, value, problems)
        elif key in SCALARS:
            kwargs[key] = _coerce(key, value, bool, problems)
        else:
            problems.append(_unknown(key, key, known))
    config = SpeedtronicConfig(**{k: v for k, v in kwargs.items() if v is not None})
    for name in SECTIONS:  # fields that failed type checks hold defaults, so checks are safe
        check = getattr(getattr(config, name), "check", None)
        problems.extend(check() if check else [])
    return config


def _build_section(name: str, value: Any, problems: list[str]) -> Any:
    cls = SECTIONS[name]
    if value is None:
        return cls()
    if not isinstance(value, dict):
        problems.append(f"{name}: must be a mapping (got {_describe(value)})")
        return None
    if name == "model":
        return _build_model(value, problems)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, item in value.items():
        if key not in names:
            problems.append(_unknown(f"{name}.{key}", str(key), names))
            continue
        coerced = _coerce(f"{name}.{key}", item, hints[key], problems)
        if coerced is not _INVALID:
            kwargs[key] = coerced
    return cls(**kwargs)


def _build_model(value: dict[str, Any], problems: list[str]) -> ModelConfig:
    params = dict(value)
    name = params.pop("name", ModelConfig.name)
    imports = params.pop("imports", [])
    name = _coerce("model.name", name, str, problems)
    imports = _coerce("model.imports", imports, list[str], problems)
    bad = [k for k in params if not isinstance(k, str) or not k.isidentifier()]
    for key in bad:
        problems.append(f"model.{key}: parameter names must be Python identifiers")
    if name is _INVALID or imports is _INVALID:
        return ModelConfig()
    return ModelConfig(name=name, imports=imports, params=params)


_INVALID = object()


def check_types(section: str, cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Type-check ``values`` against the dataclass ``cls``'s annotations (for plug-in sections)."""
    problems: list[str] = []
    hints = typing.get_type_hints(cls)
    out = {k: _coerce(f"{section}.{k}", v, hints[k], problems) for k, v in values.items()}
    if problems:
        raise ConfigError(_summary(problems), problems=problems)
    return out


def _coerce(path: str, value: Any, hint: Any, problems: list[str]) -> Any:
    """Return ``value`` if it matches ``hint`` exactly (ints widen to floats), else record why."""
    ok, result = _match(value, hint)
    if ok:
        return result
    problems.append(f"{path}: must be {_type_name(hint)} (got {_describe(value)})")
    return _INVALID


def _match(value: Any, hint: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        for arg in args:
            ok, result = _match(value, arg)
            if ok:
                return True, result
        return False, None
    if origin is Literal:
        return (value in args and isinstance(value, str)), value
    if hint is type(None):
        return value is None, None
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number, float(value) if number else None
    if hint is str:
        return isinstance(value, str), value
    if origin in (list, tuple):
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
    raise TypeError(f"unsupported config type {hint!r}")  # internal: a new field type


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


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    return repr(value)


def _unknown(path: str, key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
    return f"{path}: unknown key{hint}"


def _summary(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in config: " + "; ".join(problems)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and (text.endswith((".yaml", ".yml", ".json")) or Path(text).is_file())


# ---- YAML, overrides, the embedded default ----------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-3`` as a float, as YAML 1.2 and users expect."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, where: str) -> Any:
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: malformed YAML{at}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of sections (got {_describe(data)})")
    return data


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` strings; values parse as YAML (``1e-3``, ``true``, ``[1,2]``)."""
    out = json.loads(json.dumps(raw, default=_plain))  # deep copy of plain data
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key.path=value, e.g. optimizer.lr=1e-3")
        value = yaml.load(text, Loader=_Loader) if text.strip() else None
        parts = key.strip().split(".")
        if len(parts) == 1 and parts[0] in RUN_ALIASES and parts[0] not in out and "run" in out:
            parts = ["run", parts[0]]  # write where the file keeps it, so they cannot conflict
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return out


def default_config_text() -> str:
    """The packaged smoke config that `speedtronic train` runs with no arguments."""
    from importlib.resources import files

    return files("speedtronic.defaults").joinpath("smoke.yaml").read_text(encoding="utf-8")

"""SpeedtronicConfig: the one object that drives a run, and the package's public names.

Owns ``SpeedtronicConfig`` itself: the one loader for a dict / YAML / JSON (file or string),
output (``to_dict`` / ``to_yaml`` with secret redaction) and the facts derived from the
config (accumulation steps, tokens per step, output paths). The work is split by concern:
``sections`` (the dataclasses, their ranges and checks), ``build`` (types, ranges, checks),
``loader`` (files, safe YAML, overrides, the embedded default) and ``messages`` (wording).
Pure Python + PyYAML: importing this package never imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from speedtronic.config.build import build_sections, check_sections, check_types
from speedtronic.config.loader import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_VALUES,
    PlainLoader,
    apply_overrides,
    default_config_text,
    load_yaml,
    looks_like_path,
    parse_yaml,
    plain_copy,
    read_config_file,
)
from speedtronic.config.messages import summary
from speedtronic.config.rules import NODE_ID_RE, Range
from speedtronic.config.sections import (
    RUN_ALIASES,
    SCALARS,
    SECTIONS,
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
)
from speedtronic.errors import ConfigError

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_VALUES",
    "NODE_ID_RE",
    "REDACTED",
    "RUN_ALIASES",
    "SCALARS",
    "SECTIONS",
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PlainLoader",
    "PrecisionConfig",
    "Range",
    "RunConfig",
    "SchedulerConfig",
    "SpeedtronicConfig",
    "apply_overrides",
    "check_types",
    "default_config_text",
    "load_yaml",
    "parse_yaml",
    "plain_copy",
]

REDACTED = "<redacted>"


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
    eval: EvalConfig = field(default_factory=EvalConfig)

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
        config = cls(**build_sections(raw, problems))
        problems.extend(check_sections(config))
        if problems:
            raise ConfigError(summary(problems), problems=problems)
        return config

    @classmethod
    def from_yaml(cls, text: str, overrides: list[str] | None = None) -> SpeedtronicConfig:
        """Parse a YAML (or JSON, a subset of YAML) string."""
        return cls.from_dict(parse_yaml(text, "config"), overrides)

    @classmethod
    def from_file(cls, path: str | Path, overrides: list[str] | None = None) -> SpeedtronicConfig:
        return cls.from_dict(parse_yaml(read_config_file(path), str(path)), overrides)

    @classmethod
    def load(cls, source: Any, overrides: list[str] | None = None) -> SpeedtronicConfig:
        """One loader: a SpeedtronicConfig, a dict, a path, or a YAML/JSON string."""
        if isinstance(source, SpeedtronicConfig):
            return cls.from_dict(source.to_dict(redact=False), overrides)
        if isinstance(source, dict):
            return cls.from_dict(source, overrides)
        if isinstance(source, Path) or (isinstance(source, str) and looks_like_path(source)):
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
                if value.lora is not None:
                    out["model"]["lora"] = _plain(dataclasses.asdict(value.lora))
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
    def world_size(self) -> int:
        """Processes sharing each optimizer step: torchrun's WORLD_SIZE, 1 without it."""
        return world_size_from_env()

    @property
    def accumulation_steps(self) -> int:
        return self.accumulation_for(self.world_size)

    def accumulation_for(self, world_size: int) -> int:
        """Micro-steps per optimizer step when ``world_size`` ranks share the global batch.

        ``data.target_batch_size`` is the global batch: each rank accumulates
        target / (micro_batch_size x world_size) micro-batches.
        """
        micro = self.data.micro_batch_size
        target = self.data.target_batch_size or micro * world_size
        if target % (micro * world_size):
            raise ConfigError(
                f"data.target_batch_size: {target} must be a multiple of data.micro_batch_size"
                f" x world size = {micro} x {world_size} = {micro * world_size}"
            )
        return target // (micro * world_size)

    @property
    def batch_size(self) -> int:
        """The global batch: samples per optimizer step over every rank."""
        return self.data.micro_batch_size * self.accumulation_steps * self.world_size

    @property
    def seq_len(self) -> int:
        return int(self.data.seq_len or self.model.params.get("seq_len") or 128)

    @property
    def data_seed(self) -> int:
        """The seed of the data order (shuffling); the model's initialisation uses run.seed."""
        if self.data.seed is not None:
            return self.data.seed
        if self.distributed.enabled:  # every node its own order, the same initial weights
            node = zlib.crc32(self.distributed.resolved_node_id.encode())
            return (self.run.seed * 1_000_003 + node) % 2**32
        return self.run.seed

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


def world_size_from_env() -> int:
    """WORLD_SIZE as torchrun sets it; a value that is not a positive integer is an error."""
    text = os.environ.get("WORLD_SIZE", "1")
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"WORLD_SIZE: must be a positive integer (got {text[:40]!r})")
    return int(text)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value

"""The config sections: one dataclass per YAML section, its defaults, ranges and checks.

A numeric field declares its allowed range next to its default (``ranged(3e-4, "(0, inf)")``);
the builder applies every range the same way, after the type check, so a rule is written once
and its message (``optimizer.lr: must be > 0 (got -0.1)``) never drifts from it. The ``check``
methods hold the rules that a range cannot say: formats, and keys that depend on each other.
``key_docs`` gives every key one line of meaning and words the rules that live in a ``check``
method; docs/config.md is generated from those and the fields (a test wants both).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from speedtronic.config.messages import brief
from speedtronic.config.storage import endpoint_url_problem, is_s3_url, parse_s3_url

NODE_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "abc\n" does not match
DEVICE_RE = re.compile(r"auto|cpu|mps|cuda(:[0-9]{1,3})?")
HOOK_RE = re.compile(r"[\w.]+:[\w.]+")
HUB_USER_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?")
STEPS = "[1, 2**40]"  # counts of steps: far beyond any run, small enough for float arithmetic
MAX_NAME_BYTES = 255  # the longest file name on common file systems


@dataclass(frozen=True)
class Range:
    """An interval such as ``[0, 1)`` or ``(0, inf)``, shown as users read it: ``> 0``."""

    text: str
    low: float
    high: float
    low_open: bool
    high_open: bool
    why: str = ""

    @classmethod
    def parse(cls, text: str, why: str = "") -> Range:
        match = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", text)
        if not match:
            raise ValueError(f"bad range {text!r}")  # internal: a typo in a field declaration
        opening, low, high, closing = match.groups()
        return cls(text, _number(low), _number(high), opening == "(", closing == ")", why)

    def __contains__(self, value: float) -> bool:
        # Written as "is inside" so that NaN, which compares false to everything, is outside
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def rule(self, nullable: bool = False) -> str:
        low = self.text[1:-1].split(", ")[0]
        if self.high == float("inf"):
            text = f"{'>' if self.low_open else '>='} {low}"
        else:
            text = f"in {self.text}"
        return text + (" or null" if nullable else "") + (f", {self.why}" if self.why else "")


def _number(text: str) -> float:
    if text.startswith("2**"):
        return 2 ** int(text[3:])
    return float(text) if any(c in text for c in ".en") else int(text)


def ranged(default: Any, interval: str, why: str = "") -> Any:
    """A dataclass field whose value (when not None) must lie in ``interval``."""
    return field(default=default, metadata={"range": Range.parse(interval, why)})


@dataclass
class RunConfig:
    name: str = "speedtronic"  # also the directory name under runs/
    seed: int = ranged(
        0, "[0, 2**32)", "which random, numpy and torch (and the seeds derived from it) accept"
    )
    device: str = "auto"
    max_steps: int = ranged(100, STEPS)
    output_dir: str | None = None  # None -> runs/<name>
    group_timeout_s: float = ranged(600.0, "(0, 86400]")
    find_unused_parameters: bool = False  # DDP only

    def check(self) -> list[str]:
        problems = []
        if not DEVICE_RE.fullmatch(self.device):
            problems.append(
                f"run.device: must be auto, cpu, cuda, cuda:N or mps (got {brief(self.device)})"
            )
        if not self.name.strip():
            problems.append("run.name: must not be empty")
        elif not is_safe_name(self.name):
            problems.append(
                "run.name: must be usable as a directory name (runs/<name>): at most "
                f"{MAX_NAME_BYTES} bytes in UTF-8, no '/', '\\' or non-printable characters, "
                f"and not '.' or '..' (got {brief(self.name)})"
            )
        return problems


def is_safe_name(name: str) -> bool:
    """One path component on every OS we run on, so the first checkpoint save cannot fail."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a Python caller
        return False
    bad = any(c in "/\\" or not c.isprintable() for c in name)
    return size <= MAX_NAME_BYTES and not bad and name not in (".", "..")


@dataclass
class ModelConfig:
    """``name`` is a registered model or an import path ``package.module:factory``.

    Every other key in the YAML section is passed to the model factory as a keyword.
    """

    name: str = "reference_transformer"
    imports: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def check(self) -> list[str]:
        # Read from the text alone, so validate applies it without importing anything (issue
        # 21: validate accepted os:system, train refused it). Building the model applies the
        # rest of the rule: the object must be a class or function defined outside the stdlib.
        module = self.name.partition(":")[0] if ":" in self.name else None
        if module is None or not is_stdlib_module(module):
            return []
        return [
            f"model.name: {brief(self.name)} is in the standard library ({module}), not a model "
            "class or factory of your own; an import path must name one"
        ]


def is_stdlib_module(module: str) -> bool:
    """Whether ``module`` (dotted) belongs to the standard library, builtins included."""
    top = module.partition(".")[0]
    return top == "builtins" or top in sys.stdlib_module_names


@dataclass
class DataConfig:
    source: Literal["auto", "synthetic", "text", "tokens"] = "auto"  # auto: from the paths set
    text_path: str | None = None  # a UTF-8 text file, streamed
    token_path: str | None = None  # a flat uint16/uint32 token file, read with pread
    token_dtype: Literal["auto", "uint16", "uint32"] = "auto"  # auto: uint16 if vocab <= 65536
    tokenizer: str = "byte"  # or the path of a Hugging Face tokenizers JSON file
    micro_batch_size: int = ranged(8, "[1, 2**20]")
    target_batch_size: int | None = ranged(None, "[1, 2**30]")  # None -> micro_batch_size
    seq_len: int | None = ranged(None, "[1, 2**20]")  # None -> model.seq_len, else 128
    num_workers: int = ranged(0, "[0, 1024]")
    prefetch_factor: int = ranged(2, "[1, 1024]")
    pin_memory: bool | Literal["auto"] = "auto"
    shuffle: bool = True
    # The order in which samples are read; None: run.seed, or for a DumbDiLoCo node a seed of
    # its own derived from run.seed and node_id, so that nodes do not read the same batches.
    seed: int | None = ranged(None, "[0, 2**32)")
    shuffle_buffer: int = ranged(1024, "[0, 2**24]")  # blocks, streamed text + non-byte tokenizer
    eval_path: str | None = None  # held-out file of the same kind as the training source
    eval_fraction: float = ranged(0.0, "[0, 1)")  # or hold out this share of the file's end
    eval_every: int = ranged(0, "[0, 2**40]")  # optimizer steps between evaluations; 0 -> never
    eval_batches: int = ranged(8, "[1, 2**30]")

    @property
    def resolved_source(self) -> str:
        if self.source != "auto":
            return self.source
        return "text" if self.text_path else "tokens" if self.token_path else "synthetic"

    def check(self) -> list[str]:
        problems = []
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
        problems += self._check_unread_paths(source)
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

    def _check_unread_paths(self, source: str) -> list[str]:
        """A file named for a source that does not read it (issue 31: ``source: synthetic``
        plus ``--set data.text_path=...`` trained on synthetic tokens and exited 0). An
        explicit source and a path that contradict it are an error, never a guess."""
        if self.text_path and self.token_path:  # already "set text_path or token_path"
            return []
        paths = {"text_path": "text", "token_path": "tokens"}
        problems = [
            f"data.{key}: {brief(getattr(self, key))} is not read, because data.source is "
            f"{source!r}; set data.source: {reader} (or auto, which follows the path), or "
            f"remove data.{key}"
            for key, reader in paths.items()
            if getattr(self, key) and source != reader
        ]
        if source == "synthetic" and self.tokenizer != "byte":  # text and tokens both read it
            problems.append(
                f"data.tokenizer: {brief(self.tokenizer)} is not read, because data.source is "
                "'synthetic' (no file to tokenize); set data.text_path or data.token_path, or "
                "remove data.tokenizer"
            )
        return problems


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "muon"] = "adamw"
    lr: float = ranged(3e-4, "(0, inf)")
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = ranged(1e-8, "(0, inf)")
    weight_decay: float = ranged(0.1, "[0, inf)")
    fused: bool | Literal["auto"] = "auto"
    grad_clip: float | None = ranged(1.0, "[0, inf)")  # None or 0 disables clipping
    # ---- optimizer.name: muon (speedtronic/optim/muon.py): Muon on the hidden matrices, the AdamW
    # above on the rest. None: derived from lr and weight_decay (docs/config.md, "Muon").
    muon_lr: float | None = ranged(None, "(0, inf)")
    muon_lr_adjust: Literal["original", "match_rms_adamw"] = "original"
    muon_momentum: float = ranged(0.95, "[0, 1)")
    muon_nesterov: bool = True
    muon_ns_steps: int = ranged(5, "[1, 99]", "torch.optim.Muon's limit")
    muon_weight_decay: float | None = ranged(None, "[0, inf)")
    muon_momentum_warmup_steps: int = ranged(0, "[0, 2**40]")
    muon_precision: Literal["auto", "bf16", "fp32"] = "auto"
    muon_exclude: list[str] = field(default_factory=list)  # fnmatch patterns of names

    def check(self) -> list[str]:
        problems = []
        if not all(0 <= b < 1 for b in self.betas):
            problems.append(f"optimizer.betas: each must be in [0, 1) (got {list(self.betas)})")
        if self.name != "muon":  # a Muon key with AdamW would be ignored without a word
            defaults = OptimizerConfig()
            muon_keys = ("muon_lr", "muon_lr_adjust", "muon_momentum", "muon_nesterov")
            muon_keys += ("muon_ns_steps", "muon_weight_decay", "muon_momentum_warmup_steps")
            muon_keys += ("muon_precision", "muon_exclude")
            problems += [
                f"optimizer.{key}: only with optimizer.name: muon (got "
                f"{brief(getattr(self, key))} with {self.name})"
                for key in muon_keys
                if getattr(self, key) != getattr(defaults, key)
            ]
        return problems


@dataclass
class SchedulerConfig:
    name: Literal["cosine", "constant", "wsd"] = "cosine"
    warmup_steps: int = ranged(0, "[0, 2**40]")
    min_lr_ratio: float = ranged(0.1, "[0, 1]")
    total_steps: int | None = ranged(None, STEPS)  # None -> run.max_steps
    decay_fraction: float = ranged(0.2, "(0, 1]")  # wsd: the share of steps that decays

    def check(self) -> list[str]:
        if self.name != "wsd" and self.decay_fraction != SchedulerConfig().decay_fraction:
            return [
                f"scheduler.decay_fraction: only with scheduler.name: wsd (got "
                f"{brief(self.decay_fraction)} with {self.name})"
            ]
        return []


@dataclass
class PrecisionConfig:
    mode: Literal["auto", "bf16", "fp16", "fp32"] = "auto"


@dataclass
class CheckpointConfig:
    directory: str | None = None  # None -> <output_dir>/checkpoints
    interval: int = ranged(0, "[0, 2**40]")  # optimizer steps between saves; 0 -> at the end
    keep_last: int | None = ranged(3, "[1, 2**20]")
    resume: bool = False
    # A fresh run in a directory that holds another run's checkpoints is refused unless this
    # says to delete them first (issue 21: two runs in one directory mix without a word).
    overwrite: bool = False
    # A fresh run starts from this run's (or checkpoint's) weights: a new optimizer, schedule,
    # step count and RNG (issue 31: fine-tuning had no way but --resume)
    init_from: str | None = None

    def check(self) -> list[str]:
        problems = []
        if self.resume and self.overwrite:
            problems.append(
                "checkpoint.overwrite: not with checkpoint.resume (--resume continues the run "
                "in the directory, --overwrite deletes it)"
            )
        if self.init_from is not None and not self.init_from.strip():
            problems.append("checkpoint.init_from: must be a run or checkpoint directory (got '')")
        return problems


@dataclass
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    file: str | None = None
    json_file: str | None = None
    every_steps: int = ranged(10, STEPS)
    hooks: list[str] = field(default_factory=list)  # tensorboard, wandb, "package.module:attr"

    def check(self) -> list[str]:
        return [
            f"logging.hooks: {brief(h)} must be tensorboard, wandb or an import path "
            "'package.module:attribute'"
            for h in self.hooks
            if h not in ("tensorboard", "wandb") and not HOOK_RE.fullmatch(h)
        ]


@dataclass
class DistributedConfig:
    """DumbDiLoCo settings (docs/diloco.md). The behaviour lives in ``speedtronic.distributed``.

    ``repo_id`` is a Hugging Face Hub repo id, an object-storage bucket (``s3://bucket/prefix``,
    with ``endpoint_url`` for stores other than AWS) or a shared directory (a path or ``file://``
    URL); ``path`` is an alias for a directory. ``node_id`` defaults to ``$HF_USERNAME``, then
    ``$USER``, then ``local``; it names the node's folder in the repo, so it must be path-safe.
    """

    enabled: bool = False
    mode: Literal["dumb_diloco"] = "dumb_diloco"
    role: Literal["worker", "master"] = "worker"
    node_id: str | None = None
    repo_id: str | None = None
    path: str | None = None  # alias: a shared directory
    endpoint_url: str | None = None  # s3:// repos: the store's URL; None: $AWS_ENDPOINT_URL, AWS
    token: str | None = field(default=None, repr=False)
    inner_steps: int = ranged(500, STEPS)  # optimizer steps between syncs (H)
    poll_interval: float = ranged(60.0, "(0, 86400]", "at most a day")  # seconds
    # false: AdamW moments carry across installs; a reset measured 4-5 points worse over 12 and
    # 48 rounds (docs/diloco.md, "Why the defaults"), though upstream DiLoCo resets
    reset_inner_optimizer: bool = False
    # install the global minus this node's deltas it lacks, at the master's share, so the node
    # does not train on from weights that lack its own work
    reapply_own_delta: bool = True
    # eager: install a newer global as soon as it is downloaded, carrying the progress since the
    # last boundary (the best measured at equal wall-clock); boundary: only at an inner loop's end
    install: Literal["eager", "boundary"] = "eager"
    train_locally: bool = True  # false: a master that only coordinates
    outer_steps: int | None = ranged(None, STEPS)  # a coordinating-only master stops here
    state_dir: str | None = None  # master state; default <output_dir>/diloco_master
    # Plain averaging: the best asynchronous setting measured (docs/benchmarks.md, DumbDiLoCo);
    # the DiLoCo paper's 0.7 / 0.9 needs synchronous rounds
    outer_lr: float = ranged(1.0, "(0, inf)")
    outer_momentum: float = ranged(0.0, "[0, 1)")
    min_deltas: int = ranged(2, "[1, 2**20]")  # quorum of deltas per round
    # Timeouts feed sleeps and lock waits, which overflow past ~292 years; a week is plenty
    max_wait_s: float = ranged(600.0, "[0, 604800]", "at most a week")  # or a partial round
    max_staleness: int = ranged(4, "[0, 2**20]")  # outer steps behind: older deltas are dropped
    staleness_discount: float = ranged(0.5, "(0, 1]")  # weight x discount ** staleness
    # fleet: each round counts as its share of the fleet's work, momentum once per fleet loop;
    # naive: every round's mean in full with momentum (diverges with uneven workers)
    outer_policy: Literal["fleet", "naive"] = "fleet"
    delta_dtype: Literal["fp32", "bf16", "int8", "int4", "int2"] = "bf16"
    # what quantization dropped is added to the node's next delta (node state, checkpointed)
    error_feedback: bool = True
    upload_timeout_s: float = ranged(60.0, "[0, 86400]")  # waiting for uploads at the end
    # The end of a run (docs/diloco.md): how long a node may stay silent before the master's
    # final round goes without its last delta, and how long a worker waits for a global that
    # holds its own; None: sized from the fleet's inner-loop time (60 s to an hour)
    drain_timeout_s: float | None = ranged(None, "[0, 604800]", "at most a week")
    # Sent deltas no global includes yet: past 3 in memory they go to <output_dir> on disk, up
    # to this many bytes (8 GiB); past that, later inner loops wait in the outbox
    in_flight_disk_bytes: int = ranged(8 << 30, "[0, 2**50]")
    # > 0: at each boundary wait up to this long for the global holding this node's delta
    # (synchronous DiLoCo when min_deltas = the number of nodes); 0: never wait
    sync_wait_s: float = ranged(0.0, "[0, 604800]", "at most a week")
    # The Hub limits commits per repo (~128/hour): the master publishes at most this often
    min_publish_interval_s: float = ranged(60.0, "[0, 86400]", "at most a day")  # seconds
    # Squash the Hub repo's history every this many publishes so storage stays bounded; 0: never
    squash_every: int = ranged(0, "[0, 2**40]")
    collaborators: list[str] = field(default_factory=list)  # Hub users the master grants write
    cache_dir: str | None = None  # Hub downloads; None -> the platformdirs user cache dir

    @property
    def repo(self) -> str | None:
        return self.repo_id or self.path

    @property
    def resolved_node_id(self) -> str:
        return self.node_id or os.environ.get("HF_USERNAME") or os.environ.get("USER") or "local"

    def check(self) -> list[str]:
        problems = []
        node_id = self.resolved_node_id
        if not NODE_ID_RE.fullmatch(node_id):
            where = "" if self.node_id else " (taken from $HF_USERNAME or $USER: set it)"
            problems.append(
                f"distributed.node_id{where}: must be 1-64 characters of letters, digits, '_', "
                f"'.', '-' starting with a letter or digit (got {brief(node_id)})"
            )
        if self.repo_id and self.path and self.repo_id != self.path:
            problems.append("distributed: set repo_id or its alias path, not both")
        if self.enabled and not self.repo:
            problems.append(
                "distributed.repo_id: required when distributed is enabled "
                "(a Hub repo id, s3://bucket/prefix, or a shared directory path or file:// URL)"
            )
        problems += self._check_storage()
        if self.enabled and not self.train_locally and (self.role != "master"):
            problems.append("distributed.train_locally: only a master may set it to false")
        if self.enabled and not self.train_locally and self.outer_steps is None:
            problems.append("distributed.outer_steps: required when train_locally is false")
        return problems + [
            f"distributed.collaborators: {brief(name)} is not a Hugging Face user name "
            "(1-96 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
            for name in self.collaborators
            if not is_hub_user_name(name)
        ]

    def _check_storage(self) -> list[str]:
        """An ``s3://`` repo spec and ``endpoint_url``: the bucket, prefix and URL rules."""
        problems = []
        key = "distributed.repo_id" if self.repo_id else "distributed.path"
        if is_s3_url(self.repo):
            try:
                parse_s3_url(self.repo)
            except ValueError as exc:
                problems.append(f"{key}: {exc} (got {brief(self.repo)})")
        if self.endpoint_url is not None:
            problem = endpoint_url_problem(self.endpoint_url)
            if problem is None and self.repo and not is_s3_url(self.repo):
                problem = "only for an s3:// repo_id"
            if problem is not None:  # a URL holding credentials is not echoed
                shown = "not shown" if "@" in str(self.endpoint_url) else brief(self.endpoint_url)
                problems.append(f"distributed.endpoint_url: {problem} (got {shown})")
        return problems


def is_hub_user_name(name: str) -> bool:
    """A name the Hub could have given a user or org (its repo-id namespace rule)."""
    return bool(HUB_USER_RE.fullmatch(name)) and "--" not in name and ".." not in name


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

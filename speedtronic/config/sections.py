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

from speedtronic.config.distributed import DistributedConfig
from speedtronic.config.messages import brief
from speedtronic.config.rules import STEPS, ranged

DEVICE_RE = re.compile(r"auto|cpu|mps|cuda(:[0-9]{1,3})?")
HOOK_RE = re.compile(r"[\w.]+:[\w.]+")
MAX_NAME_BYTES = 255  # the longest file name on common file systems


@dataclass
class RunConfig:
    name: str = "speedtronic"  # also the directory name under runs/
    seed: int = ranged(
        0, "[0, 2**32)", "which random, numpy and torch (and the seeds derived from it) accept"
    )
    device: str = "auto"
    # torch's intra-op CPU threads; None or 0: torch's default, one per core (train/threads.py)
    threads: int | None = ranged(None, "[0, inf)")
    max_steps: int = ranged(100, STEPS)
    # Training seconds, counted from the first optimizer step's end (train/clock.py); with
    # max_steps the run ends at whichever comes first
    time_budget_s: float | None = ranged(None, "(0, inf)")
    output_dir: str | None = None  # None -> runs/<name>
    group_timeout_s: float = ranged(600.0, "(0, 86400]")
    find_unused_parameters: bool = False  # DDP only

    def check(self) -> list[str]:
        problems = []
        if not DEVICE_RE.fullmatch(self.device):
            problems.append(
                f"run.device: must be auto, cpu, cuda, cuda:N or mps (got {brief(self.device)})"
            )
        cores = os.cpu_count() or 1  # as generate's --threads: torch crashes far above
        if isinstance(self.threads, int) and self.threads > cores:
            problems.append(
                f"run.threads: must be in 0..{cores}, this machine's cores (got {self.threads})"
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


# The projections LoRA adapts by default: attention and MLP, as QLoRA found all of them need
# (Dettmers et al. 2023) and litgpt, torchtune and axolotl's Llama recipes do. Llama's names,
# which peft users know; the reference model's own (attn.wq, ...) are accepted too.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_TARGET_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


@dataclass
class LoraConfig:
    """``model.lora``: low-rank adapters on the model's linear layers (``train/lora.py``).

    The defaults are litgpt's and torchtune's: rank 8, alpha 16 (a scale alpha / r of 2),
    no dropout (Unsloth's advice; it also keeps a step deterministic)."""

    r: int = ranged(8, "[1, 2**16]")
    alpha: float = ranged(16.0, "(0, inf)")
    dropout: float = ranged(0.0, "[0, 1)")
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))

    def check(self) -> list[str]:
        key = "model.lora.target_modules"
        if not self.target_modules:
            return [f"{key}: must name at least one layer (e.g. {', '.join(LORA_TARGETS)})"]
        problems = [
            f"{key}: {brief(name)} must be a module name such as q_proj or attn.wq"
            for name in self.target_modules
            if not LORA_TARGET_RE.fullmatch(name)
        ]
        twice = sorted({n for n in self.target_modules if self.target_modules.count(n) > 1})
        problems += [f"{key}: {name!r} is given twice" for name in twice]
        return problems


@dataclass
class ModelConfig:
    """``name`` is a registered model or an import path ``package.module:factory``.

    Every other key in the YAML section is passed to the model factory as a keyword, except
    ``lora`` (the adapters, checked here; the factory never sees it).
    """

    name: str = "reference_transformer"
    imports: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    lora: LoraConfig | None = None  # low-rank adapters: a fine-tune of an --init-from model

    def check(self) -> list[str]:
        return self._check_name() + (self.lora.check() if self.lora is not None else [])

    def _check_name(self) -> list[str]:
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
    # --resume --rewarm N: a new schedule from the saved optimizer state (issue 40). --resume
    # records the step it started at in rewarm_from, so a later resume follows the same curve.
    rewarm_steps: int = ranged(0, "[0, 2**40]")
    rewarm_from: int | None = ranged(None, "[0, 2**40]")
    # --resume with a new end (another time budget, or steps instead of one) records where the
    # schedule stood: the LR factor there and the new end's progress there (issue 53: the LR
    # jumped back to its peak). The decay goes on from that factor (checkpoint/run_end.py).
    continue_factor: float | None = ranged(None, "[0, 1]")
    continue_progress: float | None = ranged(None, "[0, 1]")

    def check(self) -> list[str]:
        problems = []
        if (self.continue_factor is None) != (self.continue_progress is None):
            problems.append(
                "scheduler.continue_factor / continue_progress: set both or neither (got "
                f"{brief(self.continue_factor)} and {brief(self.continue_progress)})"
            )
        if self.name != "wsd" and self.decay_fraction != SchedulerConfig().decay_fraction:
            problems.append(
                f"scheduler.decay_fraction: only with scheduler.name: wsd (got "
                f"{brief(self.decay_fraction)} with {self.name})"
            )
        if self.rewarm_from is not None and not self.rewarm_steps:
            problems.append(
                f"scheduler.rewarm_from: only with scheduler.rewarm_steps > 0 (got "
                f"{brief(self.rewarm_from)} with rewarm_steps 0)"
            )
        return problems


@dataclass
class PrecisionConfig:
    mode: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    # On CPU the loop runs with subnormal floats flushed to zero (as XLA's CPU backend and
    # TensorFlow do): each subnormal costs microseconds in the tied head's backward (issue 40)
    flush_denormal: bool = True


# Keys of the reference transformer whose value changes the function its weights compute
# (seq_len only sizes the RoPE tables; init_std and zero_init_projections only the initial
# weights, which an init_from source replaces).
INIT_OVERRIDE_KEYS = (
    "vocab_size n_layer d_model n_head n_kv_head mlp_hidden rope_theta norm_eps "
    "tie_embeddings qk_norm".split()
)


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
    # Model keys allowed to differ from init_from's (issue 35: a key that changes what the
    # weights compute is refused unless named here)
    init_overrides: list[str] = field(default_factory=list)
    # Train on data tokenized with another tokenizer than init_from's (issue 48: a wrong one
    # trained silently and the checkpoints recorded it); the run then records the data's
    allow_tokenizer_mismatch: bool = False
    # --resume of a time-budgeted run with a config that sets no budget keeps the checkpoint's
    # budget and max_steps (issue 53); false ends it by run.max_steps instead (--max-steps)
    keep_budget: bool = True

    def check(self) -> list[str]:
        problems = []
        if self.resume and self.overwrite:
            problems.append(
                "checkpoint.overwrite: not with checkpoint.resume (--resume continues the run "
                "in the directory, --overwrite deletes it)"
            )
        if self.init_from is not None and not self.init_from.strip():
            problems.append("checkpoint.init_from: must be a run or checkpoint directory (got '')")
        problems += [
            f"checkpoint.init_overrides: {key!r} is not a model key that changes the function "
            f"(one of {', '.join(INIT_OVERRIDE_KEYS)})"
            for key in self.init_overrides
            if key not in INIT_OVERRIDE_KEYS
        ]
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


SET_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass
class EvalConfig:
    sets: list[str] = field(default_factory=list)  # NAME=PATH each (speedtronic.evaluate.sets)
    every: int = ranged(0, "[0, 2**40]")  # optimizer steps between scorings; 0: data.eval_every
    max_tokens: int = ranged(8192, "[1, 2**31]")  # tokens scored per set per evaluation
    batch_size: int | None = ranged(None, "[1, 2**20]")  # None: data.micro_batch_size

    def check(self) -> list[str]:
        problems, seen = [], set()
        for entry in self.sets:
            name, _, path = entry.partition("=")
            if not path or not SET_NAME_RE.fullmatch(name):
                problems.append(
                    f"eval.sets: {brief(entry)} must be NAME=PATH, NAME of letters, digits, "
                    "'_', '.', '-' (at most 64)"
                )
            elif name in seen:
                problems.append(f"eval.sets: the name {name!r} is given twice")
            seen.add(name)
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
    "eval": EvalConfig,
}
SCALARS = {"compile": False, "gradient_checkpointing": False}
RUN_ALIASES = ("name", "max_steps", "output_dir", "seed", "device")

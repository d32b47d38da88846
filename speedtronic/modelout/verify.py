"""``export --verify``: load the export with transformers and hold it to the run's own model.

The only module that imports transformers, and only when asked: it is an optional dependency
(``pip install 'speedtronic[export]'``), the tests' oracle, never a dependency of training.
Three checks, each against the run's model with its weights rounded to the export's dtype and
both computed in float32 on the CPU: the logits on a fixed batch (the max difference must stay
under ``TOLERANCE``), the greedy tokens after a fixed prompt (``speedtronic generate
--temperature 0`` against transformers' ``generate``), and the tokenizer's ids for a fixed text
(and its length: no more tokens than the embedding has rows, issue 55 item 4).
Where the run records its source's tokenizer files (an import, or a run from one), transformers'
reading of the export's special tokens, chat template and token ids is held to them too (issue
48: an export's ``eos_token`` was None and its chat template gone, unnoticed). Any difference
refuses the export (exit 1) before it is moved into place.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from speedtronic.errors import ConfigError, SpeedtronicError
from speedtronic.modelout.generate import Decoder, Sampling, generate
from speedtronic.modelout.llama import DTYPES
from speedtronic.modelout.source import RunModel
from speedtronic.train.precision import Precision

TOLERANCE = 1e-4  # max |logit difference| in float32; measured: 0.0 (docs/benchmarks.md)
IMPORT_TOLERANCE = 1e-5  # import: the same weights on both sides, nothing rounded
TEXT = "Speedtronic, überall: 1 + 1 = 2 🙂\n\tthe end."
GREEDY_TOKENS = 16


class VerifyError(SpeedtronicError):
    """transformers' reading of the export disagrees with the run's model (exit 1)."""


@dataclass
class Verified:
    max_diff: float
    positions: int  # logits compared: batch x sequence
    greedy: list[int]  # the greedy tokens both produced
    transformers_version: str


def load_transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "--verify: needs the transformers package",
            hint="pip install 'speedtronic[export]' (or export without --verify)",
        ) from None
    transformers.utils.logging.set_verbosity_error()  # no progress bars or notices on stderr
    transformers.utils.logging.disable_progress_bar()
    return transformers


def verify_export(folder: Path, run: RunModel, dtype: str) -> Verified:
    """Check the export in ``folder`` against ``run`` (see the module docstring)."""
    transformers = load_transformers()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    theirs.eval()
    ours = _rounded(run.model, dtype)
    diff, ids = _logit_gap(ours, theirs)
    if not diff <= TOLERANCE:  # NaN fails too
        raise VerifyError(
            f"--verify: transformers' logits differ from the run's by {diff:.3g} "
            f"(over {TOLERANCE:g}); the export was not written"
        )
    greedy = _greedy_agrees(ours, theirs, ids[0, :8].tolist())
    _tokenizer_agrees(transformers, folder, run)
    return Verified(diff, ids.numel(), greedy, transformers.__version__)


def verify_adapter(folder: Path, run: RunModel, dtype: str) -> Verified:
    """``export --adapter --verify``: the adapter in ``folder`` loaded by peft
    (``PeftModel.from_pretrained``) onto transformers' reading of the run's base, exported as
    ``export`` writes it, against the run's model (its adapters merged): logits and greedy
    tokens."""
    import tempfile

    from speedtronic.train import lora

    transformers = load_transformers()
    with tempfile.TemporaryDirectory(prefix="speedtronic-base-") as base_dir:
        base = _export_base(run, Path(base_dir))
        theirs = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        theirs = lora.load_peft_adapter(theirs, str(folder)).float().eval()
    ours = _rounded_adapters(run, dtype)
    diff, ids = _logit_gap(ours, theirs)
    if not diff <= TOLERANCE:  # NaN fails too
        raise VerifyError(
            f"--verify: peft's logits (the adapter on transformers' base) differ from the run's "
            f"by {diff:.3g} (over {TOLERANCE:g}); the adapter was not written"
        )
    greedy = _greedy_agrees(ours, theirs, ids[0, :8].tolist())
    return Verified(diff, ids.numel(), greedy, transformers.__version__)


def _export_base(run: RunModel, folder: Path) -> Path:
    """The run's base as ``export`` writes its model (config.json + model.safetensors, fp32)."""
    import json

    from safetensors.torch import save_file

    from speedtronic.modelout.llama import llama_config, llama_state
    from speedtronic.modelout.source import rebuild
    from speedtronic.train import lora

    model = rebuild(run.checkpoint, run.config["model"])
    lora.open_base(model, run.lora, str(run.checkpoint), lambda _line: None)
    save_file(llama_state(model, "fp32"), str(folder / "model.safetensors"), {"format": "pt"})
    config = llama_config(model.config, "fp32")
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _rounded_adapters(run: RunModel, dtype: str) -> torch.nn.Module:
    """The run's model with its adapters rounded to the export's dtype, merged, in float32."""
    if dtype == "fp32":
        return run.model.float().eval()
    from speedtronic.modelout.source import rebuild
    from speedtronic.train import lora

    rounded = {k: v.to(DTYPES[dtype]).float() for k, v in run.adapters.items()}
    model = rebuild(run.checkpoint, run.config["model"])
    lora.open_adapted(model, run.lora, rounded, str(run.checkpoint), lambda _line: None)
    return lora.merge(model).float().eval()


def verify_import(run_dir: Path, source_folder: Path) -> Verified:
    """``import --verify``: the imported run's model against transformers' own reading of the
    source directory, both in float32: logits on a fixed batch and greedy tokens."""
    from speedtronic.modelout.source import open_run

    transformers = load_transformers()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(source_folder, dtype=torch.float32)
    theirs.eval()
    ours = open_run(run_dir).model.float().eval()
    diff, ids = _logit_gap(ours, theirs)
    if not diff <= IMPORT_TOLERANCE:  # NaN fails too
        raise VerifyError(
            f"--verify: transformers' logits differ from the imported model's by {diff:.3g} "
            f"(over {IMPORT_TOLERANCE:g}); nothing was written"
        )
    greedy = _greedy_agrees(ours, theirs, ids[0, :8].tolist())
    return Verified(diff, ids.numel(), greedy, transformers.__version__)


def _logit_gap(ours: torch.nn.Module, theirs: torch.nn.Module) -> tuple[float, torch.Tensor]:
    """Max |logit difference| of the two models on a fixed random batch, and that batch."""
    cfg = ours.config
    ids = torch.randint(0, cfg.vocab_size, (2, min(32, cfg.seq_len)), generator=_seeded())
    with torch.inference_mode():
        return (ours(ids) - theirs(ids).logits).abs().max().item(), ids


def _rounded(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """A float32 copy of ``model`` whose weights went through the export's dtype."""
    copied = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        for p in copied.parameters():
            p.copy_(p.to(DTYPES[dtype]).float())
    return copied


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _greedy_agrees(ours, theirs, prompt: list[int]) -> list[int]:
    new = min(GREEDY_TOKENS, ours.config.seq_len - len(prompt))
    cpu = Precision(torch.device("cpu"), "fp32", None)
    decoder = Decoder(ours, ours.config.seq_len, cpu)
    mine = generate(decoder, prompt, Sampling(max_new_tokens=new, temperature=0.0), _seeded()).ids
    with torch.inference_mode():
        out = theirs.generate(
            torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False
        )
    other = out[0, len(prompt) :].tolist()
    if mine != other:
        raise VerifyError(
            f"--verify: greedy tokens differ from transformers' (speedtronic {mine[:6]}..., "
            f"transformers {other[:6]}...); the export was not written"
        )
    return mine


def _tokenizer_agrees(transformers, folder: Path, run: RunModel) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rows = run.model.config.vocab_size
    if len(tokenizer) > rows:  # a special token the tokenizer lacked, added as a new id
        raise VerifyError(
            f"--verify: AutoTokenizer has {len(tokenizer)} tokens for the model's {rows} "
            "embedding rows: ids it would produce cannot be embedded; the export was not written"
        )
    mine, other = run.tokenizer(TEXT), tokenizer(TEXT)["input_ids"]
    if mine != other:
        raise VerifyError(
            "--verify: AutoTokenizer's ids for a test text differ from the run's tokenizer's; "
            "the export was not written"
        )
    recorded = getattr(run.tokenizer, "specials", None)
    if recorded:
        _specials_agree(transformers, folder, tokenizer, recorded)


def _specials_agree(transformers, folder: Path, tokenizer, recorded: dict) -> None:
    """The source's special tokens, chat template and token ids, as transformers reads the
    export's files; the first that differs refuses the export."""
    from speedtronic.modelout.tokenizer_files import ADDITIONAL, TOKEN_KEYS

    config = transformers.AutoConfig.from_pretrained(folder)
    generation = transformers.GenerationConfig.from_pretrained(folder)
    pairs = [(k, getattr(tokenizer, k, None), recorded[k]) for k in TOKEN_KEYS if k in recorded]
    template = recorded.get("chat_template")
    if isinstance(template, list):  # named templates: transformers holds them as a mapping
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    pairs.append(("chat_template", tokenizer.chat_template, template))
    extra = [t for t in recorded.get(ADDITIONAL, []) if t not in tokenizer.all_special_tokens]
    pairs.append((ADDITIONAL, extra and "missing", extra and recorded[ADDITIONAL]))
    for name, where in [("config_ids", config), ("generation_ids", generation)]:
        ids = recorded.get(name) or {}
        pairs += [(f"{name[:-4]}.{k}", getattr(where, k, None), v) for k, v in ids.items()]
    for key, theirs, ours in pairs:
        if theirs != ours:
            raise VerifyError(
                f"--verify: the export's {key} reads {theirs!r} in transformers, the source's is "
                f"{ours!r}; the export was not written"
            )

"""Shared by the model-out tests: tiny trained runs (byte-level, synthetic, a BPE tokenizers
file) and the CLI runner with the one-line error check."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from conftest import TINY
from torch import nn
from typer.testing import CliRunner

from speedtronic.cli.app import app

runner = CliRunner()
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness. Ünïcode, too: naïve café, 🙂.\n"
) * 40


def invoke(*args: Any, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def assert_one_line_error(result, *needles: str, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("hint:")]
    assert len(lines) == 1 and lines[0].startswith("speedtronic: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def config_of(tmp_path: Path, name: str = "run", **sections: dict) -> dict:
    config = copy.deepcopy(TINY)
    config["run"]["output_dir"] = str(tmp_path / name)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def train(tmp_path: Path, name: str = "run", **sections: dict) -> Path:
    """A tiny run trained in this process; returns its output directory."""
    from speedtronic.runtime import train_from_config

    config = config_of(tmp_path, name, **sections)
    train_from_config(config, console=False)
    return Path(config["run"]["output_dir"])


def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def write_bpe(tmp_path: Path, template_bos: bool = False, specials=("<bos>",)) -> Path:
    """A small byte-level BPE tokenizers file trained on TEXT, ``specials`` its first ids;
    ``template_bos`` adds a post-processor that puts a BOS token in front (as many published
    tokenizers do)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(specials),
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    if template_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", special_tokens=[("<bos>", tok.token_to_id("<bos>"))]
        )
    path = tmp_path / "bpe.json"
    tok.save(str(path))
    return path


def train_text(tmp_path: Path, tokenizer: str = "byte", name: str = "run", **sections) -> Path:
    """A tiny run on a text file with ``tokenizer`` (byte or a tokenizers file)."""
    vocab = 256 if tokenizer == "byte" else 320
    data = {"text_path": str(text_file(tmp_path)), "tokenizer": tokenizer}
    return train(
        tmp_path,
        name,
        model={"vocab_size": vocab, **sections.pop("model", {})},
        data={**data, **sections.pop("data", {})},
        **sections,
    )


def latest(run: Path) -> Path:
    from speedtronic.checkpoint.layout import read_latest

    root = run / "checkpoints"
    return root / read_latest(root)


class LossOnly(nn.Module):
    """A model whose forward returns a loss, labels or not, never logits (``model.name:
    modelout_support:LossOnly``): generate must say what it needs."""

    def __init__(self, vocab_size: int = 64, **_sizes: Any):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 8)
        self.head = nn.Linear(8, vocab_size)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        target = input_ids if labels is None else labels
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


class TinyLM(nn.Module):
    """Any model whose forward gives logits without labels (``modelout_support:TinyLM``)."""

    def __init__(self, vocab_size: int = 256, **_sizes: Any):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 16)
        self.head = nn.Linear(16, vocab_size)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        if labels is None:
            return logits
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


class NeedsLabels(TinyLM):
    def forward(self, input_ids, labels):
        return super().forward(input_ids, labels)


def tensors(folder: Path) -> dict:
    """Every tensor of a transformers directory's safetensors files (shards included)."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def assert_same_tensors(a: dict, b: dict) -> None:
    """The same names, dtypes and bits."""
    import torch

    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key

"""The ``data.eval_every`` split (``val``) of a text source (issue 53, item 8): its bits per byte
are known and in summary.json, and a held-out split with ``eval_every: 0`` is evaluated once, at
the end of the run (litgpt's final validation), rather than never."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from speedtronic.runtime import train_from_config
from tests.evaluate.test_scorer import bpe_for


def text_file(tmp_path: Path) -> Path:
    rng = random.Random(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "é"]
    path = tmp_path / "corpus.txt"
    lines = (" ".join(rng.choice(words) for _ in range(12)) for _ in range(500))
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


class Events:
    def __init__(self):
        self.seen: list[tuple[str, dict]] = []

    def on_event(self, event, payload) -> None:
        self.seen.append((event, payload))


def run(tiny, tmp_path, **data) -> tuple[dict, list[dict]]:
    tiny["model"]["vocab_size"] = 320
    tiny["data"].update(text_path=str(text_file(tmp_path)), eval_fraction=0.2, **data)
    events = Events()
    train_from_config(tiny, console=False, hooks=[events])
    summary = json.loads((Path(tiny["run"]["output_dir"]) / "summary.json").read_text())
    return summary, [p for e, p in events.seen if e == "eval"]


def test_a_byte_level_split_has_its_bits_per_byte(tiny, tmp_path):
    summary, evals = run(tiny, tmp_path, eval_every=3)
    val = summary["eval"]["val"]
    assert val["bits_per_byte"] == pytest.approx(val["loss"] / math.log(2))
    assert [e["step"] for e in evals] == [3, 6]
    assert evals[-1]["eval_bits_per_byte"] == pytest.approx(val["bits_per_byte"])
    assert summary["curve"]["eval"][-1][-1] == pytest.approx(val["bits_per_byte"])


def test_a_tokenized_split_has_its_bits_per_byte_from_its_bytes(tiny, tmp_path):
    tokenizer = bpe_for(text_file(tmp_path).read_text(), tmp_path / "bpe.json")
    summary, _ = run(tiny, tmp_path, eval_every=3, tokenizer=str(tokenizer))
    val = summary["eval"]["val"]
    # a BPE token of these words spends several bytes: bits per byte well under loss / ln 2
    assert 0 < val["bits_per_byte"] < val["loss"] / math.log(2) / 2


def test_a_split_with_eval_every_0_is_evaluated_once_at_the_end(tiny, tmp_path):
    summary, evals = run(tiny, tmp_path, eval_every=0)
    assert [e["step"] for e in evals] == [tiny["run"]["max_steps"]]
    assert summary["eval"]["val"]["loss"] == pytest.approx(evals[0]["eval_loss"])

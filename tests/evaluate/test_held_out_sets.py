"""Named held-out sets during training (issue 39): ``eval.sets`` scored at the eval cadence,
reported per set as loss and bits per byte, equal to ``speedtronic eval`` on the same text and
checkpoint; a token folder's held-out part; bad entries refused before anything is written;
training unchanged by them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from modelout_support import TEXT, config_of, invoke, latest, train_text
from safetensors.torch import load_file

from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError, DataError
from speedtronic.observe.integrations import scalars
from speedtronic.observe.metrics import format_event


def events(path: Path, name: str) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["event"] == name]


def eval_text(run: Path, text: Path) -> dict:
    result = invoke("eval", latest(run), "--text", text, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["texts"][0]


def test_each_set_is_reported_at_the_cadence_and_equals_speedtronic_eval(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text(TEXT[:300], encoding="utf-8")
    docs = [TEXT[i : i + 60] for i in range(0, 300, 60)]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    log = tmp_path / "events.jsonl"
    run = train_text(
        tmp_path,
        eval={"every": 3, "sets": [f"short={short}", f"docs={corpus}"], "max_tokens": 4096},
        logging={"json_file": str(log)},
    )
    found = events(log, "eval_set")
    assert [(e["step"], e["set"]) for e in found] == [
        (3, "short"), (3, "docs"), (6, "short"), (6, "docs"),
    ]  # fmt: skip
    last = {e["set"]: e for e in found if e["step"] == 6}
    nbytes = len(TEXT[:300].encode("utf-8")) - 1  # the first byte is context only
    assert last["short"]["tokens"] == last["short"]["text_bytes"] == nbytes
    cli = eval_text(run, short)  # the final checkpoint, the same windows: the same figures
    assert last["short"]["bits_per_byte"] == pytest.approx(cli["bits_per_byte"], rel=1e-6)
    assert last["short"]["loss"] == pytest.approx(cli["loss"], rel=1e-6)
    joined = tmp_path / "joined.txt"  # documents joined by a newline, as the docs say
    joined.write_text("\n".join(docs), encoding="utf-8")
    assert last["docs"]["bits_per_byte"] == pytest.approx(
        eval_text(run, joined)["bits_per_byte"], rel=1e-6
    )
    inspected = invoke("ckpt", "inspect", run, "--format", "json")
    recorded = json.loads(inspected.stdout)["checkpoints"][-1]["eval_sets"]
    assert recorded["docs"] == {k: last["docs"][k] for k in ("step", "loss", "bits_per_byte")}
    shown = invoke("ckpt", "inspect", run).stdout
    assert f"held-out set short: bits/byte {cli['bits_per_byte']:.4f}" in shown
    line = format_event("eval_set", last["short"])
    assert "set short" in line and f"bits/byte {cli['bits_per_byte']:.4f}" in line
    step, tags = scalars("eval_set", last["docs"])
    assert step == 6 and set(tags) == {"eval/docs/loss", "eval/docs/bits_per_byte"}


def test_a_token_folders_held_out_part_is_a_set(tmp_path):
    from typer.testing import CliRunner

    from speedtronic.cli.app import app

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": TEXT[i : i + 120]}) + "\n" for i in range(40)))
    folder = tmp_path / "tokens"
    made = CliRunner().invoke(
        app, ["data", "tokenize", str(corpus), str(folder), "--val-fraction", "0.5",
              "--workers", "1"],
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    log = tmp_path / "events.jsonl"
    config = config_of(
        tmp_path,
        model={"vocab_size": 256},
        data={"token_path": str(folder)},
        eval={"every": 6, "sets": [f"val={folder}"], "max_tokens": 300},
        logging={"json_file": str(log)},
    )
    from speedtronic.runtime import train_from_config

    train_from_config(config, console=False)
    (found,) = events(log, "eval_set")
    assert found["set"] == "val" and found["tokens"] == 300
    assert found["text_bytes"] == 300  # byte-level: one byte per scored token
    assert 0 < found["bits_per_byte"] < 9


@pytest.mark.parametrize(
    "section,needle",
    [
        ({"every": 2, "sets": ["no-path"]}, "eval.sets: 'no-path' must be NAME=PATH"),
        ({"every": 2, "sets": ["a=x.txt", "a=y.txt"]}, "the name 'a' is given twice"),
        ({"sets": ["a=x.txt"]}, "eval.sets: needs eval.every or data.eval_every > 0"),
        ({"max_tokens": 0}, r"eval.max_tokens: must be in \[1, 2\*\*31\] \(got 0\)"),
    ],
)
def test_bad_eval_sets_config_names_the_key(section, needle):
    with pytest.raises(ConfigError, match=needle):
        SpeedtronicConfig.from_dict({"eval": section})


def test_a_missing_set_fails_before_the_output_directory_is_touched(tmp_path):
    from speedtronic.runtime import train_from_config

    config = config_of(
        tmp_path,
        model={"vocab_size": 256},
        data={"text_path": str(_text(tmp_path))},
        eval={"every": 2, "sets": [f"gone={tmp_path / 'missing.txt'}"]},
    )
    with pytest.raises(DataError, match=r"eval.sets\[gone\]: cannot read .*missing.txt"):
        train_from_config(config, console=False)
    assert not Path(config["run"]["output_dir"]).exists()


def test_scoring_sets_leaves_training_bit_identical(tmp_path):
    text = _text(tmp_path)
    plain = train_text(tmp_path, name="plain")
    scored = train_text(
        tmp_path, name="scored", eval={"every": 2, "sets": [f"t={text}"], "max_tokens": 64}
    )
    ours, theirs = (load_file(str(latest(r) / "model.safetensors")) for r in (plain, scored))
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_a_token_folder_of_another_tokenizer_is_refused_as_a_set(tmp_path):
    """One tokenizer identity (issue 53 item 9): an eval.sets folder tokenized with another
    tokenizer than the run's fed the model ids that mean other tokens, and its bits per byte
    were counted with the folder's tokenizer, silently. The same tokenizer saved otherwise
    is accepted."""
    pytest.importorskip("tokenizers")
    from modelout_support import text_file, write_bpe
    from tokenizers import Tokenizer

    from speedtronic.runtime import train_from_config

    bpe = write_bpe(tmp_path)
    compact = tmp_path / "compact.json"
    Tokenizer.from_file(str(bpe)).save(str(compact), pretty=False)
    for name, tokenizer in [("bytes", "byte"), ("same", compact)]:
        args = [text_file(tmp_path), tmp_path / name, "--tokenizer", tokenizer]
        args += ["--separator", "<bos>"] if name == "same" else []
        made = invoke("data", "tokenize", *args, "--val-fraction", "0.5", "--workers", 1)
        assert made.exit_code == 0, made.stderr
    sets = {"every": 6, "max_tokens": 64}
    data = {"text_path": str(text_file(tmp_path)), "tokenizer": str(bpe)}
    config = config_of(tmp_path, model={"vocab_size": 320}, data=data,
                       eval={**sets, "sets": [f"b={tmp_path / 'bytes'}"]})  # fmt: skip
    with pytest.raises(DataError, match=r"eval.sets\[b\]: .*bytes is tokenized with bytes"):
        train_from_config(config, console=False)
    assert not (tmp_path / "run").exists()
    config["eval"]["sets"] = [f"s={tmp_path / 'same'}"]
    train_from_config(config, console=False)

"""``data tokenizer train`` refuses what would give a broken tokenizer (issue 46): a special
token ordinary text holds (``--special the`` cut "the" out of every word when decoded with
``skip_special_tokens``), and sources with no document, the same for text as for JSON Lines."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from speedtronic.cli.app import app

tokenizers = pytest.importorskip("tokenizers")
runner = CliRunner()
TEXT = "the cat sat on a mat, then another\n" * 20


def train(tmp_path, source, *args: str):
    out = tmp_path / "mine.json"
    result = runner.invoke(
        app, ["data", "tokenizer", "train", str(source), str(out), "--vocab-size", "270", *args]
    )
    return result, out


def assert_refused(result, out, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speedtronic: error: "), result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert not out.exists()


@pytest.mark.parametrize("token", ["the", "a", "<=>", "[1]", "[x]", "<a b>", " ", ""])
def test_a_special_token_ordinary_text_holds_is_refused(tmp_path, token):
    source = tmp_path / "t.txt"
    source.write_text(TEXT, encoding="utf-8")
    result, out = train(tmp_path, source, "--special", token)
    assert_refused(result, out, f"--special {token!r}", "<|name|>, <name> or [NAME]")


def test_delimited_special_tokens_are_taken_and_text_keeps_its_words(tmp_path):
    source = tmp_path / "t.txt"
    source.write_text(TEXT, encoding="utf-8")
    specials = ["<|pad|>", "</s>", "[CLS]"]
    result, out = train(tmp_path, source, *(a for s in specials for a in ("--special", s)))
    assert result.exit_code == 0, result.output
    tok = tokenizers.Tokenizer.from_file(str(out))
    assert [tok.token_to_id(s) for s in specials] == [1, 2, 3]
    line = TEXT.splitlines()[0]
    assert tok.decode(tok.encode(line).ids, skip_special_tokens=True) == line


@pytest.mark.parametrize(
    ("name", "content"),
    [("e.txt", ""), ("w.txt", " \n\t\n"), ("e.jsonl", ""), ("w.jsonl", '{"text": " "}\n')],
)
def test_sources_without_a_document_are_refused_in_every_format(tmp_path, name, content):
    source = tmp_path / name
    source.write_text(content, encoding="utf-8")
    result, out = train(tmp_path, source)
    assert_refused(result, out, f"{source}: no document to train on")


def test_blank_documents_are_skipped_not_counted(tmp_path):
    source = tmp_path / "d.jsonl"
    docs = ["", "  ", "the cat sat on a mat", "then another"]
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    result, _ = train(tmp_path, source, "--held-out", "0", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["documents"] == 2

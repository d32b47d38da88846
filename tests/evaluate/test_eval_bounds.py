"""``speedtronic eval`` on hostile input (issue 46): every read bounded, every bad task line one
line naming the file and the line, a model that gives NaN refused rather than printed as ``NaN``.
"""

from __future__ import annotations

import json

import pytest
from modelout_support import assert_one_line_error, invoke, latest, train_text

from speedtronic.errors import DataError
from speedtronic.evaluate import sets, tasks

GOOD = '{"ctx": "It was", "endings": ["the best", "the worst"], "label": 0}\n'


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_text(tmp_path_factory.mktemp("bounds"))


def task(tmp_path, *lines: str):
    path = tmp_path / "task.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    return path


# The task file is read before the run is opened: these need no run.
BAD_LINES = [
    ('{"ctx": "a", "endings": ["b", "c"], "label": "\u00b2"}\n', "field 'label'"),
    ('{"ctx": "a\\ud800", "endings": ["b", "c"], "label": 0}\n', "surrogate"),
    ("[" * 100_000 + "\n", "nested too deep"),
]


@pytest.mark.parametrize("line,needle", BAD_LINES, ids=["superscript", "surrogate", "deep"])
def test_a_bad_task_line_is_one_line_naming_file_and_line(tmp_path, line, needle):
    path = task(tmp_path, GOOD, line)
    result = invoke("eval", tmp_path / "no-run", "--task", "hellaswag", "--data", path)
    assert_one_line_error(result, f"{path}:2", needle)


def test_a_task_line_over_the_limit_is_refused_naming_file_line_and_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks, "MAX_LINE_BYTES", 4096)
    path = task(tmp_path, GOOD, '{"ctx": "' + "x" * 5000 + '"}\n')
    result = invoke("eval", tmp_path / "no-run", "--task", "hellaswag", "--data", path)
    assert_one_line_error(result, f"{path}:2", "4,096 bytes")


def test_dev_zero_is_refused_at_once_not_read(tmp_path):
    data = invoke("eval", tmp_path / "no-run", "--task", "hellaswag", "--data", "/dev/zero")
    assert_one_line_error(data, "/dev/zero:1", "1,048,576 bytes")
    text = invoke("eval", tmp_path / "no-run", "--text", "/dev/zero")
    assert_one_line_error(text, "/dev/zero", "regular file")


def test_a_text_over_the_limit_is_refused_naming_it(run, tmp_path, monkeypatch):
    from speedtronic.cli import evaluate

    monkeypatch.setattr(evaluate, "MAX_TEXT_BYTES", 1000)
    big = tmp_path / "big.txt"
    big.write_text("x" * 1001)
    assert_one_line_error(invoke("eval", run, "--text", big), str(big), "1000 bytes")


def test_an_item_the_scorer_refuses_names_file_and_line(run, tmp_path):
    empty = task(tmp_path, GOOD, '{"ctx": "", "endings": ["b", "c"], "label": 0}\n')
    result = invoke("eval", run, "--task", "hellaswag", "--data", empty)
    assert_one_line_error(result, f"{empty}:2", "'ctx'")
    long = task(tmp_path, GOOD, json.dumps({"ctx": "a", "endings": ["b", "c" * 40], "label": 0}))
    result = invoke("eval", run, "--task", "hellaswag", "--data", long)
    assert_one_line_error(result, f"{long}:2", "ending 1", "does not fit")


def nan_checkpoint(run, tmp_path):
    """A copy of the run's checkpoint with every weight NaN (meta.json's hash updated)."""
    import hashlib
    import shutil

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    checkpoint = tmp_path / "nan"
    shutil.copytree(latest(run), checkpoint)
    weights = load_file(checkpoint / "model.safetensors")
    with safe_open(checkpoint / "model.safetensors", "pt") as f:
        metadata = f.metadata()  # says which tensors are tied
    for tensor in weights.values():
        tensor.fill_(torch.nan)
    save_file(weights, checkpoint / "model.safetensors", metadata)
    body = (checkpoint / "model.safetensors").read_bytes()
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta["files"]["model.safetensors"] = {
        "bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    return checkpoint


def test_a_model_giving_nan_is_an_error_not_nan_in_json(run, tmp_path):
    checkpoint = nan_checkpoint(run, tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("It was the best of times, it was the worst of times.")
    for args in (("--text", text), ("--task", "hellaswag", "--data", task(tmp_path, GOOD))):
        result = invoke("eval", checkpoint, *args, "--format", "json")
        assert result.exit_code == 1 and result.stdout == "", result.stdout
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "non-finite log-probabilities" in errors[0], result.stderr
        assert "Traceback" not in result.stderr


def test_a_large_eval_max_tokens_reads_in_pieces(tmp_path):
    """16 x 2**31 bytes asked for: read as far as the file goes, never allocated at once."""
    text = tmp_path / "t.txt"
    text.write_text("héllo " * 100)
    assert sets._read_text(str(text), "eval.sets[t]", sets.BYTES_PER_TOKEN << 31) == "héllo " * 100
    cut = sets._read_text(str(text), "eval.sets[t]", 2)  # a character cut at the limit: left out
    assert cut == "h"
    with pytest.raises(DataError, match="must be a regular file"):
        sets._read_text("/dev/zero", "eval.sets[z]", sets.BYTES_PER_TOKEN << 31)


def test_the_largest_eval_max_tokens_runs_and_its_cost_is_said_at_the_start(tmp_path, monkeypatch):
    """``eval.max_tokens: 2**31`` (inside its range) trains instead of a MemoryError, and one
    notice prices the evaluations before the first one (the time floor lowered for a tiny run);
    a small evaluation says nothing."""
    from speedtronic.evaluate import plugin

    monkeypatch.setattr(plugin, "NOTICE_S", 0.0)
    held = tmp_path / "held.txt"
    held.write_text("It was the best of times, it was the worst of times. " * 40)
    log = tmp_path / "events.jsonl"
    big = {"every": 3, "sets": [f"held={held}"], "max_tokens": 2**31}
    train_text(tmp_path, eval=big, logging={"json_file": str(log)})
    records = [json.loads(line) for line in log.read_text().splitlines()]
    said = [r["message"] for r in records if r["event"] == "notice" and "eval.sets" in r["message"]]
    assert len(said) == 1 and "2,119 tokens scored per evaluation x 2 evaluations" in said[0]
    first_eval = next(i for i, r in enumerate(records) if r["event"] == "eval_set")
    assert records.index(next(r for r in records if r.get("message") == said[0])) < first_eval
    small = {**big, "max_tokens": 16}
    train_text(tmp_path, name="small", eval=small, logging={"json_file": str(tmp_path / "s.jsonl")})
    assert "eval.sets:" not in (tmp_path / "s.jsonl").read_text()

"""``speedtronic eval --data hf://datasets/...`` against the Hub emulator (issue 39): the task
file comes through the project's one Hub client, pinned to a commit, cached, and a pinned
source works afterwards with no Hub at all; its scores are the local file's.
"""

# The environment must be set before huggingface_hub is imported, hence:
# ruff: noqa: E402
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_home_"))
os.environ.pop("HF_HUB_OFFLINE", None)

import pytest
from modelout_support import assert_one_line_error, invoke, train_text

from speedtronic.data.ingest import hub_source

pytestmark = [pytest.mark.hub, pytest.mark.usefixtures("library_sleeps")]
ITEMS = [
    {"ctx": "It was the best of", "endings": ["times,", "café", "wisdom"], "label": 0},
    {"ctx": "it was the age of", "endings": ["Ünïcode", "foolishness."], "label": "1"},
]
BODY = "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in ITEMS).encode()


@pytest.fixture
def hub(monkeypatch, hub_emulator, tmp_path):
    monkeypatch.setattr(hub_source, "CLIENT_OPTIONS", {"sleep": lambda s: None})
    monkeypatch.setattr(hub_source, "_BUDGET", [])
    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    hub_emulator.create_repo("datasets/alice/swag", files={"data/val.jsonl": BODY})
    return hub_emulator


def test_a_hub_task_file_is_pinned_cached_and_then_works_offline(hub, tmp_path, monkeypatch):
    run = train_text(tmp_path)
    local = tmp_path / "val.jsonl"
    local.write_bytes(BODY)
    args = ("--task", "hellaswag", "--format", "json", "--per-example")
    expected = json.loads(invoke("eval", run, *args, "--data", local).stdout)
    result = invoke("eval", run, *args, "--data", "hf://datasets/alice/swag/data/val.jsonl")
    assert result.exit_code == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["n"] == 2 and got["acc"] == expected["acc"]
    assert [e["logprobs"] for e in got["examples"]] == [e["logprobs"] for e in expected["examples"]]
    pinned = next(w for w in result.stderr.split() if w.startswith("hf://datasets/alice/swag@"))
    assert len(pinned.split("@")[1].split("/")[0]) == 40  # the commit sha
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    offline = invoke("eval", run, *args, "--data", pinned)
    assert offline.exit_code == 0, offline.stderr
    assert json.loads(offline.stdout)["acc"] == expected["acc"]


def test_a_missing_hub_file_is_one_line(hub, tmp_path):
    run = train_text(tmp_path)
    result = invoke(
        "eval", run, "--task", "hellaswag", "--data", "hf://datasets/alice/swag/no.jsonl"
    )
    assert_one_line_error(result, "no file no.jsonl in datasets/alice/swag")


def test_an_edited_cached_task_file_is_not_scored_under_the_pinned_name(hub, tmp_path, monkeypatch):
    """The cache is checked against the listing recorded at download: an edit is fetched anew
    while the Hub answers, and refused in one line naming the file when it does not."""
    run = train_text(tmp_path)
    args = ("--task", "hellaswag", "--format", "json", "--per-example", "--data")
    first = invoke("eval", run, *args, "hf://datasets/alice/swag/data/val.jsonl")
    assert first.exit_code == 0, first.stderr
    pinned = next(w for w in first.stderr.split() if w.startswith("hf://datasets/alice/swag@"))
    cached = Path(first.stderr.split("(cached at ")[1].split(")")[0])
    edited = BODY.replace(b'"label": 0', b'"label": 2')
    cached.write_bytes(edited)
    again = invoke("eval", run, *args, pinned)
    assert again.exit_code == 0, again.stderr
    assert [e["label"] for e in json.loads(again.stdout)["examples"]] == [0, 1]
    assert cached.read_bytes() == BODY  # fetched anew
    cached.write_bytes(edited)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    offline = invoke("eval", run, *args, pinned)
    assert_one_line_error(offline, str(cached), "does not match")

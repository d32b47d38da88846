"""Every ``--format json`` document and every event record follows the same naming rules.

snake_case keys; a duration's name ends in ``_s``, a size's in ``_bytes`` (rates end in
``_per_s``); ``schema_version`` at the top. Each command runs for real on a tiny model (bench
with its hidden small-measurement options) and its document is checked by ``problems``.
Maps whose keys are data (module, dtype and tensor names) and the model parameters echoed by
``validate`` (named by whoever wrote the model) are not field names, so are not checked.
"""

from __future__ import annotations

import copy
import json
import re
import time

import pytest
import yaml
from conftest import TINY
from hub.test_cli_hub import emu, step_count  # noqa: F401 - emu is a fixture
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.distributed import repo_status
from speedtronic.runtime import train_from_config

runner = CliRunner()
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
DURATION_WORDS = {"seconds", "second", "secs", "sec", "ms", "msec", "millis", "minutes"}
DURATION_WORDS |= {"mins", "hours", "duration", "elapsed", "latency", "stall", "timeout"}
SIZE_WORDS = {"bytes", "kb", "mb", "gb", "tb", "kib", "mib", "gib"}
DATA_KEYED = {"params_by_module", "dtypes", "tied"}  # keys are names, values still checked
# bench's legacy names: its schema is pinned field by field by tests/cli/test_bench.py.
BENCH_LEGACY = {"seconds", "bytes", "memory_gb", "peak_memory_gb"}


def key_problem(key: str, value: object) -> str | None:
    if not SNAKE.match(key):
        return "not snake_case"
    words = key.split("_")
    if "_per_s" in key:
        return None  # a rate: tokens_per_s, gb_per_s, gb_per_s_median
    if DURATION_WORDS & set(words) and not key.endswith("_s"):
        return "a duration must end in _s"
    if SIZE_WORDS & set(words) and not key.endswith("_bytes"):
        return "a size must end in _bytes"
    values = list(value.values()) if isinstance(value, dict) else [value]  # or one per kind
    if key.endswith("_bytes") and not all(v is None or type(v) is int for v in values):
        return "bytes must be an int"
    if key.endswith("_s") and not all(v is None or type(v) in (int, float) for v in values):
        return "seconds must be a number"
    return None


def problems(doc: object, path: str = "", skip: frozenset = frozenset()) -> dict[str, str]:
    """``{path: problem}`` for every key of ``doc`` (recursively) that breaks the rules."""
    found: dict[str, str] = {}
    if isinstance(doc, list):
        for i, item in enumerate(doc):
            found |= problems(item, f"{path}[{i}]", skip)
    elif isinstance(doc, dict):
        parent = path.rsplit(".", 1)[-1].split("[")[0]
        for key, value in doc.items():
            here = f"{path}.{key}" if path else key
            if here in skip:
                continue
            problem = None if parent in DATA_KEYED else key_problem(key, value)
            if problem:
                found[here] = problem
            found |= problems(value, here, skip)
    return found


def test_the_rules_catch_what_they_should():
    bad = {"stallMs": 1, "wait_ms": 2, "memory_gb": 3, "bytes_up": 4, "seconds": 5}
    bad |= {"elapsed": 6, "blob_bytes": 1.5, "wait_s": "soon"}
    good = {"elapsed_s": 1, "stall_s": 0.1, "size_bytes": 4, "gb_per_s": 2.0, "loss": 1.0}
    good |= {"tokens_per_s": 1, "data_wait_share": 0.1, "created_at": "x", "dtypes": {"F32": 1}}
    assert set(problems({**bad, **good})) == set(bad)


def checked(doc: dict, skip: frozenset = frozenset()) -> dict:
    assert isinstance(doc.get("schema_version"), int), "no schema_version"
    assert not problems(doc, skip=skip), problems(doc, skip=skip)
    return doc


def invoke(*args: str) -> dict:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def write(tmp_path, config: dict) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_validate_json(tiny, tmp_path):
    tiny["distributed"] = {"enabled": True, "repo_id": str(tmp_path), "node_id": "a"}
    document = invoke("validate", "-c", write(tmp_path, tiny), "--format", "json")
    doc = checked(document, frozenset({"config.model"}))  # model keys are the model's own
    assert doc["facts"]["diloco_delta_bytes"]["fp32"] > 0 and doc["config"]["run"]


def test_ckpt_inspect_json(tiny, tmp_path):
    tiny["checkpoint"] = {"interval": 2}
    tiny["logging"]["json_file"] = "metrics.jsonl"
    train_from_config(tiny, console=False)
    doc = checked(invoke("ckpt", "inspect", str(tmp_path / "run"), "--format", "json"))
    assert doc["history"]["loss_points"] == 4
    assert doc["checkpoints"][0]["params_by_module"]["tok_emb"]["size_bytes"] > 0


def test_train_events(tiny, tmp_path):
    tiny["checkpoint"] = {"interval": 3}
    result = runner.invoke(app, ["train", "-c", write(tmp_path, tiny), "--log-format", "json"])
    assert result.exit_code == 0, result.stderr
    for line in result.stdout.splitlines():
        checked(json.loads(line))


def test_train_summary_and_runs_json(tiny, tmp_path):
    config = write(tmp_path, tiny)
    doc = checked(invoke("train", "-c", config, "--format", "json"), frozenset({"config"}))
    assert doc["status"] == "completed" and doc["train_s"] >= 0 and doc["curve"]["train"]
    doc = checked(invoke("runs", str(tmp_path), "--format", "json"))
    assert [run["status"] for run in doc["runs"]] == ["completed"]


def test_hub_status_json(emu):  # noqa: F811 - the fixture
    emu.create_repo("alice/run", private=True)
    nodes = {"node-a": {"seq": 1, "base_outer_step": 0, "last_delta_at": 0, "tokens": 8}}
    published = step_count(1, repo_status.iso(time.time()), nodes)
    emu.push("alice/run", {"global/step_count.json": published})
    emu.push("alice/run", {"nodes/node-b/delta_00000001.safetensors": b"d" * 10})
    doc = checked(invoke("hub", "status", "alice/run", "--format", "json"))
    assert doc["nodes"] and doc["size_bytes"] > 0
    checked(invoke("hub", "init", "alice/run", "--dry-run", "--format", "json"))


@pytest.mark.slow
def test_bench_json(tmp_path):
    config = copy.deepcopy(TINY)
    config["run"]["output_dir"] = str(tmp_path / "run")
    args = ["bench", "-c", write(tmp_path, config), "--quick", "--format", "json"]
    doc = invoke(*args, "--matmul-size", "64", "--min-time", "0.01", "--rounds", "1")
    assert isinstance(doc["schema_version"], int)
    found = problems(doc)
    assert {path.rsplit(".", 1)[-1] for path in found} <= BENCH_LEGACY, found

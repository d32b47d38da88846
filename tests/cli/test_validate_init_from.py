"""``validate`` checks the run ``train`` with the same options starts (issue 48): it takes
``--init-from`` and shows the model and tokenizer taken from the source, takes train's node
options, and its uploads per hour follow ``--step-time``."""

from __future__ import annotations

import json

import pytest
import yaml
from modelout_support import invoke, text_file, train_text, write_bpe

from speedtronic.registry import reference_config

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validate-init")
    return train_text(tmp, str(write_bpe(tmp)))


def test_validate_shows_the_model_and_tokenizer_init_from_trains(run, tmp_path):
    config = tmp_path / "mine.yaml"  # names no model and no tokenizer: both come from the run
    data = {"text_path": str(text_file(tmp_path)), "micro_batch_size": 4, "target_batch_size": 8}
    config.write_text(yaml.safe_dump({"run": {"device": "cpu"}, "data": data}))
    result = invoke("validate", "-c", config, "--init-from", run, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    model = json.loads((run / "checkpoints" / "step_0000000006" / "meta.json").read_text())
    model = model["config"]["model"]
    assert doc["config"]["model"]["vocab_size"] == 320  # the run's, not the default model's
    params = {k: v for k, v in model.items() if k not in ("name", "imports")}
    assert doc["facts"]["parameters"] == reference_config(params).parameter_count()
    init = doc["facts"]["init_from"]
    assert init["source"].startswith(str(run)) and init["tokenizer"].endswith("tokenizer.json")


def test_validate_takes_trains_node_options_and_step_time(tmp_path):
    repo = tmp_path / "shared"
    args = ("--role", "worker", "--node-id", "w1", "--repo", repo, "--step-time", "2")
    result = invoke("validate", *args, "--set", "distributed.inner_steps=100", "--format", "json")
    assert result.exit_code == 0, result.stderr
    facts = json.loads(result.stdout)["facts"]
    assert facts["diloco_node"] == f"worker w1 on {repo}"
    assert facts["diloco_uploads_per_hour"].startswith("18.0 per node")  # 3600 / (100 x 2 s)


def test_validate_says_a_hub_fleet_cannot_fit_the_commit_budget_and_the_way_out(tmp_path):
    # Issue 54 item 7: 4 workers at H 10 and 8 s a step, round records (a keyframe commit
    # every 10 publishes besides the publish itself): 180 deltas + 60 x 1.1 publishes an hour
    args = ["--role", "worker", "--node-id", "w1", "--nodes", "4", "--step-time", "8"]
    args += ["--set", "distributed.global_dtype=deltas", "--set", "distributed.delta_dtype=int2"]
    args += ["--set", "distributed.outer_momentum=0", "--format", "json"]

    def validate(repo, inner_steps):
        sets = ("--repo", repo, "--set", f"distributed.inner_steps={inner_steps}")
        result = invoke("validate", *args, *sets)
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        return doc["facts"], [w for w in doc["warnings"] if "commit budget" in w]

    facts, (line,) = validate("my-org/run", 10)
    assert facts["diloco_hub_commits_per_hour"].startswith("246 for 4 worker(s) at 8 s/step")
    assert "cannot fit one Hub repo" in line and "s3://BUCKET/PREFIX" in line
    need = int(line.split("distributed.inner_steps to at least ")[1].split()[0])
    assert validate("my-org/run", need)[1] == []  # the value it names fits
    assert validate(str(tmp_path / "shared"), 10)[1] == []  # a directory has no budget

"""A mistyped directory path for the fleet's repo (issue 55, item 8).

``no_such_fleet`` and ``no_such_dir/fleet`` look like relative paths; the second is also how a
Hub repo id is spelled. ``storage status`` names either as a missing directory (it takes no Hub
repo); ``validate`` says it is read as a Hub repo with no such directory here; a node that cannot
reach the Hub at start says the directory is missing too; and a worker that never reached its
repo ends with exit 1 and one line, not exit 0 as if it had taken part.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from diloco_support import Log, settings
from modelout_support import assert_one_line_error, invoke

from diloco.test_nodes import FakeTrainer, model
from speedtronic.distributed.hub.prepare import prepare_node
from speedtronic.distributed.repos import no_directory_note
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import TransportError
from speedtronic.train.trainer import TrainResult

DNS = "cannot reach huggingface.co (Name or service not known)"


@pytest.mark.parametrize("repo", ["no_such_fleet", "no_such_dir/fleet"])
def test_storage_status_names_a_missing_directory(tmp_path, monkeypatch, repo):
    """Before: "'no_such_fleet': must start with s3://"."""
    monkeypatch.chdir(tmp_path)
    result = invoke("storage", "status", repo)
    line = assert_one_line_error(result, repo, "no such directory")
    assert "must start with" not in line


def test_validate_says_a_hub_spelled_repo_is_no_directory_here(tmp_path, monkeypatch):
    """Before: validate passed it with no word that it would be taken for a Hub repo."""
    monkeypatch.chdir(tmp_path)
    args = ("--role", "worker", "--node-id", "w1", "--repo", "no_such_dir/fleet")
    result = invoke("validate", *args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    said = json.loads(result.stdout)["facts"]["diloco_repo"]
    assert said.startswith("the Hugging Face Hub repo no_such_dir/fleet"), said
    assert "no directory no_such_dir/fleet here" in said and "./no_such_dir/fleet" in said, said
    (tmp_path / "no_such_dir" / "fleet").mkdir(parents=True)  # now it is one
    result = invoke("validate", *args, "--format", "json")
    assert json.loads(result.stdout)["facts"]["diloco_repo"].startswith("the directory "), result


class DeadHub:
    """A Hub client whose every request fails as a DNS error does (not permanent)."""

    node_id, repo_id = "w1", "no_such_dir/fleet"

    def visibility(self):
        raise TransportError(DNS)


def test_a_hub_unreachable_at_start_names_the_missing_directory_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = Log()
    prepare_node(DeadHub(), SimpleNamespace(role="worker", collaborators=()), log)
    [line] = log.warnings
    assert DNS in line and "going on" in line
    assert "no directory no_such_dir/fleet here" in line and "./no_such_dir/fleet" in line, line


class Down(LocalTransport):
    """A repo no request reaches."""

    def describe(self):
        return "no_such_dir/fleet"

    def read_step_count(self):
        raise TransportError(DNS)

    def list_deltas(self):
        raise TransportError(DNS)

    def upload(self, path, data):
        raise TransportError(DNS)

    def read(self, path, max_bytes):
        raise TransportError(DNS)


def test_a_worker_that_never_reached_its_repo_does_not_end_as_if_it_took_part(tmp_path):
    """Before: it trained alone through DNS errors and exited 0, its deltas unsent."""
    net = model(1.0)
    config = settings(repo="no_such_dir/fleet", upload_timeout_s=0.3)
    worker = WorkerPlugin(config, net, Down(tmp_path / "repo"), Log())
    worker.end.repo_note = no_directory_note(config.repo)  # as distributed/setup sets it
    trainer = FakeTrainer(net, max_steps=4)
    worker.on_train_start(trainer)
    for _ in range(4):
        trainer.train_step(worker)
    result = TrainResult(steps=4, final_loss=None, tokens=40, samples=4, elapsed_s=1.0)
    worker.on_train_end(trainer, result)
    assert result.unsent and result.failure is not None
    assert "never reached no_such_dir/fleet" in result.failure, result.failure
    assert "no directory no_such_dir/fleet here" in result.failure, result.failure
    assert "\n" not in result.failure


def test_train_exits_1_with_the_line_of_a_node_that_took_no_part(tmp_path, monkeypatch):
    import speedtronic.runtime as runtime

    def fake(cfg, hooks=(), console=False):
        failure = "diloco: w1 never reached no_such_dir/fleet"
        return TrainResult(1, None, 0, 0, 0.1, unsent=True, failure=failure)

    monkeypatch.setattr(runtime, "train_from_config", fake)
    result = invoke("train", "--max-steps", "1", "--output-dir", tmp_path / "out")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    resume, line = result.stderr.strip().splitlines()  # how to send them, then why exit 1
    assert "--resume" in resume and "Traceback" not in result.stderr
    assert line.startswith("speedtronic: error: diloco: w1 never reached no_such_dir/fleet")

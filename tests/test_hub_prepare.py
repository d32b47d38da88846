"""A node's start on the Hub: the master creates a missing repo and tries its grants; a worker
on a missing repo, or with a token that cannot write, stops at once with one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from diloco_support import Log
from hub_fake import FakeHub, FakeHubClient

from speedtronic.distributed.hub_errors import HubError, RepoNotFound
from speedtronic.distributed.hub_transport import HubTransport

REPO = "alice/run"


def settings(role, collaborators=()):
    return SimpleNamespace(
        role=role,
        collaborators=list(collaborators),
        inner_steps=500,
        poll_interval=60.0,
    )


def transport(hub, role="worker"):
    return HubTransport(FakeHubClient(REPO, node_id=f"{role}-1", hub=hub))


def test_a_master_creates_a_missing_repo_private_with_its_readme():
    hub, log = FakeHub(), Log()
    transport(hub, "master").prepare(settings("master"), log)
    assert hub.repos[REPO].private and "README.md" in hub.repos[REPO].head.files
    transport(hub, "master").prepare(settings("master"), log)  # a restart: no new commit
    assert len(hub.repos[REPO].history) == 2  # the repo's first commit, then the README


def test_a_worker_on_a_missing_repo_is_told_to_run_hub_init():
    with pytest.raises(RepoNotFound) as caught:
        transport(FakeHub()).prepare(settings("worker"), Log())
    assert "alice/run not found" in str(caught.value)
    assert str(caught.value).endswith("create it with speedtronic hub init alice/run")
    assert caught.value.hint is None  # one line on stderr
    assert caught.value.permanent


def test_a_token_that_cannot_write_fails_at_start():
    hub = FakeHub()
    hub.create("my-org/run")
    client = FakeHubClient("my-org/run", node_id="node-b", hub=hub)
    with pytest.raises(HubError, match="node-b: token cannot write to my-org/run: alice is not"):
        HubTransport(client).prepare(settings("worker"), Log())


def test_the_master_reports_the_grants_it_cannot_make():
    hub, log = FakeHub(), Log()
    hub.users.add("bob")
    transport(hub, "master").prepare(settings("master", ["bob"]), log)
    assert any("bob" in w for w in log.warnings), log.warnings


def test_cadence_warnings_name_the_knob():
    hub = FakeHub()
    hub.create(REPO)
    often = SimpleNamespace(inner_steps=5, poll_interval=60.0)
    warnings = transport(hub).cadence_warnings(often, step_time_s=0.1)
    assert any("distributed.inner_steps" in w for w in warnings), warnings
    busy = SimpleNamespace(inner_steps=500, poll_interval=0.1)
    warnings = transport(hub).cadence_warnings(busy, step_time_s=0.5)
    assert any("distributed.poll_interval" in w for w in warnings), warnings
    assert transport(hub).cadence_warnings(settings("worker"), step_time_s=0.5) == []

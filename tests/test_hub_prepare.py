"""A node's start on the Hub: the master creates a missing repo and tries its grants; a worker
on a missing repo, or with a token that cannot write, stops at once with one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from diloco_support import Log
from hub_fake import FakeHub, FakeHubClient

from speedtronic.distributed.hub.transport import HubTransport
from speedtronic.distributed.protocol import delta_path
from speedtronic.hub.budget import Budget
from speedtronic.hub.errors import HubError, RepoNotFound

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


def test_the_master_warns_once_an_hour_when_the_fleet_commits_near_the_limit():
    """The start-up estimate cannot know the fleet; the deltas the master sees arrive can."""
    now = [0.0]
    hub = FakeHub(clock=lambda: now[0])
    client = FakeHubClient(REPO, node_id="master-1", hub=hub, budget=Budget(lambda: now[0]))
    master = HubTransport(client)
    master.prepare(settings("master"), Log())
    master.list_deltas()  # what is there at start is not counted as arrivals
    for seq in range(12):  # 2 nodes, one delta each a minute: 120 commits an hour
        for name in ("a", "b"):
            hub.push(REPO, {delta_path(name, seq): b"d"}, [], "delta")
        now[0] += 60.0
        master.list_deltas()
        if seq < 8:  # up to 16 deltas in 10 minutes: 96 an hour, under the warning at 102
            assert master.take_warnings() == [], seq
    [warning] = master.take_warnings() + master.take_warnings()
    assert "120 commits an hour (120 deltas, 0 of this master's)" in warning
    assert "raise distributed.inner_steps from 500 to at least 586" in warning
    now[0] += 3600.0
    hub.push(REPO, {delta_path("a", 99): b"d"}, [], "delta")
    master.list_deltas()
    assert master.take_warnings() == []  # an hour later the pace is gone, and so is the line

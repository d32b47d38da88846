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


def hub_master(now):
    hub = FakeHub(clock=lambda: now[0])
    client = FakeHubClient(REPO, node_id="master-1", hub=hub, budget=Budget(lambda: now[0]))
    master = HubTransport(client)
    master.prepare(settings("master"), Log())
    master.list_deltas()  # what is there at start is not counted as arrivals
    return hub, master


def test_the_master_warns_once_an_hour_when_the_fleet_commits_near_the_limit():
    """The start-up estimate cannot know the fleet; the deltas the master sees arrive can."""
    now = [0.0]
    hub, master = hub_master(now)
    warnings = []
    for seq in range(12):  # 2 nodes, one delta each a minute: 120 commits an hour
        for name in ("a", "b"):
            hub.push(REPO, {delta_path(name, seq): b"d"}, [], "delta")
        now[0] += 60.0
        master.list_deltas()
        warnings += master.take_warnings()
    [warning] = warnings  # from the second minute on: two deltas of each node give its pace
    assert "120 commits an hour (120 deltas, 0 of this master's)" in warning
    assert "raise distributed.inner_steps from 500 to at least 586" in warning
    now[0] += 3600.0
    hub.push(REPO, {delta_path("a", 99): b"d"}, [], "delta")
    master.list_deltas()
    assert master.take_warnings() == []  # an hour later the pace is gone, and so is the line


def test_issue27_defect7_the_rate_early_in_a_run_is_the_fleets_pace_not_a_window_average():
    """Issue 27: 8 s into a run committing ~8,000 an hour, the line said 108 (the last 10
    minutes' count x 6), advised 43 for inner_steps, and was not repeated for an hour."""
    now = [0.0]
    hub, master = hub_master(now)
    seqs, said = dict.fromkeys(("w0", "w1", "w2", "w3", "w4"), 0), []
    for tick in range(1, 60):  # five workers, a commit every 0.45 s; the master lists every 2 s
        for _ in range(4):
            node = f"w{sum(seqs.values()) % 5}"
            seqs[node] += 1
            hub.push(REPO, {delta_path(node, seqs[node]): b"d"}, [], "delta")
        now[0] = tick * 1.8
        master.list_deltas()
        said += [(now[0], w) for w in master.take_warnings()]
    [(when, line)] = said
    figure = int(line.split("taking ")[1].split(" commits")[0])
    assert when < 40.0 and 7_200 <= figure <= 8_800, line  # 8,000 an hour, within 10%
    need = int(line.rsplit("at least ", 1)[1])
    assert need >= 40 * 7_000 / 102  # an inner_steps that fits the Hub's limit at that pace


def test_the_rate_line_comes_again_when_the_pace_doubles_within_the_hour():
    now = [0.0]
    hub, master = hub_master(now)
    said, seq = [], 0
    for minute in range(1, 30):
        per_minute = 2 if minute < 10 else 6  # 120 an hour, then 360
        for _ in range(per_minute):
            seq += 1
            hub.push(REPO, {delta_path(f"n{seq % per_minute}", seq): b"d"}, [], "delta")
        now[0] = minute * 60.0
        master.list_deltas()
        said += master.take_warnings()
    assert len(said) == 2 and "360 commits an hour" in said[1], said


def test_a_burst_of_first_deltas_is_no_pace():
    """Eight workers whose first deltas land together, one inner loop of 5 minutes each: 96 an
    hour, under the line; a window of the last minutes would have seen 8 in a few seconds."""
    now = [0.0]
    hub, master = hub_master(now)
    for loop in range(3):
        now[0] = 300.0 * loop + 30.0
        for node in range(8):
            hub.push(REPO, {delta_path(f"n{node}", loop): b"d"}, [], "delta")
        master.list_deltas()
        for _ in range(5):  # idle listings in between
            now[0] += 40.0
            master.list_deltas()
            assert master.take_warnings() == []

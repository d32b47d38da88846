"""DumbDiLoCo over the Hub, end to end: the Hub emulator, a master and two workers, all processes.

The emulator (tests/hub_emulator.py, run as a process) answers as the Hub does: every delta and
global is a ``*.safetensors`` file, so it goes through the Git LFS batch API, a PUT to a signed
URL on the emulator's second (storage) origin, verify, and a commit naming the object; the
globals come back through a 302 to that origin. About 20% of the requests fail at random on
each origin, with 5xx, 429 (short reset headers), a dropped connection or an answer cut short,
and half of the failed commits land before their answer is lost. The nodes are plain
``python -m speedtronic train`` processes in the default environment (hf_xet installed, no
``HF_HUB_DISABLE_XET``) pointed at it through ``HF_ENDPOINT`` with ``distributed.repo_id:
alice/run``: the master creates the repo itself, coordinates only, and ends by itself once
every worker's last delta is in (I6). Then: every process exited 0 without a traceback, no
request went to Xet, every delta and global took the LFS path, outer steps advanced, every
delta uploaded was applied exactly once, the repo holds exactly one commit per upload, publish
and node announcement (nothing committed twice), every node left the final global in its
output directory, and the token is nowhere in the logs or files. A training master finishing
first with the default publish pacing ends with every node's last delta too. Quick checks
follow: a worker whose token cannot write (read-only, or a user without
access) and one pointed at a missing repo stop at once with one line on stderr, after two
requests at most.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import proc_support
import pytest
import yaml
from diloco.test_e2e import (
    CONFIG,
    assert_run_ended_whole,
    installs,
    log_of,
    master_first_run,
    wait_until,
)

from speedtronic.distributed.hub.cadence import estimate_commits_per_hour
from speedtronic.distributed.protocol import NODES_DIR, STEP_COUNT
from speedtronic.hub.client import HubClient, RepoNotFound

# Processes end to end against a local server: the slow tier (python -m pytest -m slow)
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
REPO = "alice/run"
TOKEN = "hf_e2eWriterToken0123456789abcdef"  # alice's write token
READONLY = "hf_e2eReadOnlyToken0123456789abcd"  # alice's too, read-only
BOB = "hf_e2eBobToken0123456789abcdefghi"  # a user with no role in alice's namespace
FAULT_RATE = 0.2
WORKERS = ("worker-1", "worker-2")
STEPS = 150  # per worker, 5 per inner loop
BATCH = 32  # slow enough that the workers often install globals while they train
ASK_REPO = ("GET", "/api/models/alice/run", 200)  # a node's first two requests, answered
ASK_TOKEN = ("GET", "/api/whoami-v2", 200)

# The emulator's own CLI (serve_cli), on a subclass that writes what it saw when it stops:
# every request, every injected fault, and the repo's commits.
SERVE = """
import json, os, sys
sys.path.insert(0, os.environ["EMU_TESTS"])
from hub_emulator import HubEmulator
from hub_emulator_faults import serve_cli

class Recording(HubEmulator):
    def close(self):
        super().close()
        stats = self.stats()
        stats["lfs"] = {r: sorted(repo.head.lfs) for r, repo in self.state.repos.items()}
        with open(os.environ["EMU_STATS"], "w") as f:
            json.dump(stats, f)

sys.exit(serve_cli(Recording, sys.argv[1:]))
"""


class Emulator:
    """The emulator process: its URL, and on ``stop`` what it recorded."""

    def __init__(self, tmp_path: Path, *args: str):
        self.port_file, self.stats_file = tmp_path / "emulator.url", tmp_path / "emulator.json"
        env = {**os.environ, "EMU_TESTS": str(TESTS), "EMU_STATS": str(self.stats_file)}
        command = [sys.executable, "-c", SERVE, "--port-file", str(self.port_file)]
        command += ["--token", f"{TOKEN}=alice", "--token", f"{BOB}=bob", *args]
        self.log = open(tmp_path / "emulator.log", "w")  # noqa: SIM115 - closed in stop
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        started = wait_until(self.port_file.exists, watch=self.process)
        assert started, (tmp_path / "emulator.log").read_text()
        self.url = self.port_file.read_text()

    def stop(self) -> dict:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        assert proc_support.wait(self.process) == 0
        self.log.close()
        return json.loads(self.stats_file.read_text())

    def client(self, tmp_path: Path) -> HubClient:
        """The test's own client (it goes through the faults too, and retries them)."""
        return HubClient(
            REPO,
            token=TOKEN,
            endpoint=self.url,
            cache_dir=tmp_path / "test-cache",
            max_backoff_s=2.0,
        )


def node_env(tmp_path: Path, url: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {
        **env,
        "HF_ENDPOINT": url,
        "HF_TOKEN": token,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "OMP_NUM_THREADS": "1",  # four processes on two cores
        "SPEEDTRONIC_HUB_MAX_BACKOFF_S": "1",  # documented in docs/hub.md, for emulators
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    }


def start(
    tmp_path: Path, url: str, role: str, node: str, steps: int, token: str = TOKEN, **more
) -> subprocess.Popen:
    config = {**CONFIG, "run": {**CONFIG["run"], "name": node, "max_steps": steps}}
    config["logging"] = {**CONFIG["logging"], "json_file": "metrics.jsonl"}
    config["data"] = {**CONFIG["data"], "micro_batch_size": BATCH}
    config["distributed"] = {
        **CONFIG["distributed"],
        "role": role,
        "node_id": node,
        "repo_id": REPO,
        "outer_steps": 10_000,
        "poll_interval": 0.4,  # each request of ~1,000 a minute costs the four processes CPU
        "min_publish_interval_s": 0,
        "max_staleness": 1000,  # every delta counts: none dropped for staleness
        "cache_dir": str(tmp_path / "cache"),
        **more,
    }
    path = tmp_path / f"{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / f"{node}.log", "w")  # noqa: SIM115 - closed with the process
    command = [sys.executable, "-m", "speedtronic", "train", "-c", str(path)]
    command += ["--output-dir", str(tmp_path / node)]
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=node_env(tmp_path, url, token)
    )


def events(tmp_path: Path, node: str, kind: str) -> list[dict]:
    path = tmp_path / node / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["event"] == kind]


def master_rounds(tmp_path: Path) -> list[tuple[int, ...]]:
    """The master's rounds, from its log: a coordinating-only master writes no JSONL."""
    pattern = r"diloco round: outer step (\d+) \| deltas (\d+) in, (\d+) stale, (\d+) rejected"
    text = (tmp_path / "master.log").read_text()
    return [tuple(int(g) for g in m.groups()) for m in re.finditer(pattern, text)]


def step_count(client: HubClient) -> dict | None:
    try:
        data = client.download(STEP_COUNT, client.head(), 1 << 16)
    except RepoNotFound:
        return None
    return None if data is None else json.loads(data)


def pending_deltas(client: HubClient) -> list[str]:
    return [f.path for f in client.list_files(NODES_DIR, client.head())]


def test_a_master_and_two_workers_train_through_a_failing_hub(tmp_path):
    began = time.monotonic()
    rates = ("--fault-rate", str(FAULT_RATE), "--storage-fault-rate", str(FAULT_RATE))
    emulator = Emulator(tmp_path, *rates, "--seed", "1")
    client = emulator.client(tmp_path)
    processes: list[subprocess.Popen] = []
    try:
        master = start(tmp_path, emulator.url, "master", "master", 1, train_locally=False)
        processes.append(master)
        up = wait_until(lambda: step_count(client) is not None, watch=master)
        assert up, log_of(tmp_path, "master")
        phases = {"master up": time.monotonic() - began}
        processes += [start(tmp_path, emulator.url, "worker", w, STEPS) for w in WORKERS]
        for worker, process in zip(WORKERS, processes[1:], strict=True):
            assert proc_support.wait(process) == 0, log_of(tmp_path, worker)
        phases["workers done"] = time.monotonic() - began
        assert proc_support.wait(master) == 0, log_of(tmp_path, "master")  # the run ended
        assert not pending_deltas(client), pending_deltas(client)
        phases["master ended"] = time.monotonic() - began
        published, history = step_count(client), client.commits()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        stats = emulator.stop()
    wall_s = time.monotonic() - began

    for node in ("master", *WORKERS):
        assert "Traceback" not in (tmp_path / f"{node}.log").read_text(), log_of(tmp_path, node)
    hung_up = ("BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError")
    for origin in (stats, stats["storage"]):  # no emulator bug, and faults on both origins
        assert [e for e in origin["errors"] if not e.startswith(hung_up)] == []
        faults, requests = origin["injected"], origin["requests"]
        assert len(faults) >= FAULT_RATE / 2 * len(requests), (len(faults), len(requests))
    faults, requests, stored = stats["injected"], stats["requests"], stats["storage"]["requests"]
    assert not [r for r in requests if "xet" in r[1]], "a request took the Xet path"

    # Outer steps advanced, one per round, and the workers trained from the published globals
    rounds = master_rounds(tmp_path)  # (outer step, included, stale, rejected) per round
    # >= 1, not more: on a loaded machine every delta may arrive before the master's first
    # round (seen once under load: one round holding all of them, correctly)
    assert published["outer_step"] >= 1, log_of(tmp_path, "master")
    assert [r[0] for r in rounds] == list(range(1, published["outer_step"] + 1)), rounds
    logs = {w: (tmp_path / f"{w}.log").read_text() for w in WORKERS}
    assert all("starting from global outer step" in text for text in logs.values()), logs
    installed = sum(installs(text) for text in logs.values())  # timing-bound

    # Every delta uploaded was applied exactly once: none stale or rejected, none left over
    uploads = sum(len(events(tmp_path, w, "diloco_upload")) for w in WORKERS)
    assert sum(r[1] for r in rounds) == uploads, (uploads, rounds)
    assert sum(r[2] + r[3] for r in rounds) == 0, rounds

    # One commit each, nothing committed twice: the repo's first, the README, every upload
    # and every publish (outer step 0 at start, then at most one per round: a round whose
    # publish was still waiting when the next one came is superseded by it, never sent), but
    # the last round's, which goes out once more to say the run has ended when it had landed
    # before the master's end (issue 55 item 10)
    commits = stats["commits"][REPO]
    steps = [int(s) for c in commits for s in re.findall(r": publish outer step (\d+)$", c)]
    once = steps[:-1] if steps[-2:-1] == steps[-1:] else steps
    assert len(once) == len(set(once)) and steps == sorted(steps), commits
    assert steps[0] == 0 and steps[-1] == published["outer_step"] == rounds[-1][0], commits
    publishes = len(steps)
    assert 2 <= len(once) <= 1 + len(rounds)
    announcements = [c for c in commits if c.endswith("/node.json")]
    assert len(announcements) == len(WORKERS), commits
    assert len(commits) == 2 + uploads + publishes + len(WORKERS) == len(history), commits
    deltas = [c for c in commits if ": delta " in c]
    assert len(deltas) == len(set(deltas)) == uploads, commits
    # ... each delta and global through the LFS path: a PUT of its object to the storage (the
    # end's second publish of a round sends bytes the storage holds already: no PUT)
    puts = [s for m, _, s in stored if m == "PUT" and s == 200]
    assert len(puts) >= uploads + len(once), (len(puts), uploads, len(once))
    assert "global/latest.safetensors" in stats["lfs"][REPO], stats["lfs"]
    # ... and within the budget the transport computes for this cadence over the training
    # time (of the slower worker): one upload per inner loop and one publish per delta
    end = max((events(tmp_path, w, "run_end")[0] for w in WORKERS), key=lambda e: e["elapsed_s"])
    per_hour = estimate_commits_per_hour(
        nodes=len(WORKERS),
        inner_steps=CONFIG["distributed"]["inner_steps"],
        step_time_s=end["elapsed_s"] / end["steps"],
        min_publish_interval_s=0,
    )
    assert uploads + publishes - 1 <= per_hour * end["elapsed_s"] / 3600

    # The run ended whole: every worker's last delta in the final step count, and every node
    # left the final global in its output directory
    assert all(published["nodes"][w]["final"] for w in WORKERS), published["nodes"]
    assert_run_ended_whole(tmp_path, None, list(WORKERS), ["master"])

    # The token never left the environment
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path

    posts = [status for _, path, status in requests if "/commit/" in path]
    storage_faults = stats["storage"]["injected"]
    print(
        f"\nhub e2e: {wall_s:.1f} s, outer step {published['outer_step']}, uploads {uploads}, "
        f"globals installed by workers {installed}, commits {len(commits)}, "
        f"API requests {len(requests)}, faults {len(faults)} {count_kinds(faults)}, "
        f"storage requests {len(stored)}, faults {len(storage_faults)} "
        f"{count_kinds(storage_faults)}, commit POSTs {len(posts)} "
        f"({len(posts) - posts.count(200)} failed, "
        f"{len(commits) - 1 - posts.count(200)} of them landed), "
        f"phases {', '.join(f'{k} {v:.1f} s' for k, v in phases.items())}"
    )


def test_I6_a_master_finishing_first_ends_with_every_nodes_last_delta_on_the_hub(tmp_path):
    emulator = Emulator(tmp_path)  # no faults: the end of the run, at the default pacing
    client = emulator.client(tmp_path)
    try:

        def start_node(tmp_path, role, node, steps):
            pacing = {"min_publish_interval_s": 60.0, "max_staleness": 4}  # the defaults
            return start(tmp_path, emulator.url, role, node, steps, **pacing)

        master_first_run(tmp_path, start_node, lambda: step_count(client) is not None)
        counted = step_count(client)
        assert not pending_deltas(client)  # every delta and announcement consumed
    finally:
        emulator.stop()
    assert all(counted["nodes"][n]["final"] for n in ("master", "worker-1", "worker-2")), counted


def test_a_fleet_over_the_repos_commit_budget_folds_its_deltas_and_ends_whole(tmp_path):
    # The Hub's ~128 commits an hour, scaled down: 6 commits per 20 s, where the fleet's own
    # cadence (a repo, its README, outer step 0, two announcements, a delta per 5 steps of
    # each worker, the publishes) would make ~30 in less time. Refused commits (429) are not
    # applied; the workers' uploads wait for the reset or give up and fold into the next
    # delta; the run must still end whole, every process exit 0 (issue 54 item 7).
    emulator = Emulator(tmp_path, "--commit-limit", "6", "--commit-window", "20")
    client = emulator.client(tmp_path)
    rounds = {"global_dtype": "deltas", "delta_dtype": "int2"}
    processes: list[subprocess.Popen] = []
    try:
        master = start(tmp_path, emulator.url, "master", "master", 1, train_locally=False, **rounds)
        processes.append(master)
        assert wait_until(lambda: step_count(client) is not None, watch=master)
        processes += [start(tmp_path, emulator.url, "worker", w, 60, **rounds) for w in WORKERS]
        for node, process in zip(("master", *WORKERS), processes, strict=True):
            assert proc_support.wait(process) == 0, log_of(tmp_path, node)
        published, left = step_count(client), pending_deltas(client)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        stats = emulator.stop()
    posts = [s for m, p, s in stats["requests"] if m == "POST" and "/commit/" in p]
    assert posts.count(429) == stats["commits_refused"] >= 1, posts
    rounds_run = master_rounds(tmp_path)
    uploads = sum(len(events(tmp_path, w, "diloco_upload")) for w in WORKERS)
    assert sum(r[1] for r in rounds_run) == uploads and not left, (uploads, rounds_run, left)
    assert all(published["nodes"][w]["final"] for w in WORKERS), published["nodes"]
    assert_run_ended_whole(tmp_path, None, list(WORKERS), ["master"])


def count_kinds(faults: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, _, kind in faults:
        out[kind] = out.get(kind, 0) + 1
    return out


@pytest.mark.parametrize(
    ("token", "private", "why"),
    [
        (READONLY, True, "the token is read-only"),
        (BOB, False, "bob is not a member of alice"),  # a public repo bob may read, not write
    ],
)
def test_a_worker_whose_token_cannot_write_stops_at_once_with_one_line(
    tmp_path, token, private, why
):
    emulator = Emulator(tmp_path, "--token", f"{READONLY}=alice", "--readonly", READONLY)
    try:
        emulator.client(tmp_path).create_repo(private=private)
        worker = start(tmp_path, emulator.url, "worker", "worker-1", 40, token=token)
        assert proc_support.wait(worker) == 1, log_of(tmp_path, "worker-1")
    finally:
        stats = emulator.stop()
    lines = (tmp_path / "worker-1.log").read_text().splitlines()
    assert len(lines) == 1, lines  # no traceback, no hint, no retry warnings
    assert lines[0].startswith("speedtronic: error: worker-1: token cannot write to alice/run: ")
    assert why in lines[0]
    # "At once" is counted in requests, not seconds (a loaded machine is slow, not wrong):
    # it asked two questions (is the repo there, what may this token do) and stopped: no
    # upload, no retry loop (the request before them is the test's own create_repo)
    assert [tuple(r) for r in stats["requests"][1:]] == [ASK_REPO, ASK_TOKEN], stats["requests"]
    assert token not in (tmp_path / "worker-1.log").read_text()


def test_a_worker_on_a_missing_repo_is_told_to_run_hub_init(tmp_path):
    emulator = Emulator(tmp_path)
    try:
        worker = start(tmp_path, emulator.url, "worker", "worker-1", 40)
        assert proc_support.wait(worker) == 1, log_of(tmp_path, "worker-1")
    finally:
        stats = emulator.stop()
    lines = (tmp_path / "worker-1.log").read_text().splitlines()
    assert lines == [
        "speedtronic: error: worker-1: alice/run not found (or not visible to this token): "
        "create it with speedtronic hub init alice/run"
    ]
    assert [tuple(r) for r in stats["requests"]] == [(*ASK_REPO[:2], 404)]  # asked once

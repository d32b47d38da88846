"""`speedtronic hub init | grant | status`: the logic over a fake, the CLI over the emulator.

The first half tests ``hub_admin`` against ``Fake``, a few-line stand-in for ``HubClient``
that records which methods were called (so ``--dry-run`` is proved read-only). The second half
drives the real CLI (``speedtronic.cli.app``, in-process and as a subprocess) against the local
Hub emulator through the real ``HubClient``, with ``HF_ENDPOINT`` and ``HF_TOKEN`` set.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import proc_support
import pytest
from typer.testing import CliRunner

from speedtronic.cli import hub as hub_module
from speedtronic.config import SpeedtronicConfig
from speedtronic.distributed import repo_status
from speedtronic.distributed.hub import admin as hub_admin
from speedtronic.distributed.protocol import keyframe_path
from speedtronic.errors import ConfigError, TransportError
from speedtronic.hub.budget import Budget

READ_ONLY = {"whoami", "visibility", "head", "list_files", "download", "storage_bytes", "commits"}
READ_ONLY |= {"user_exists", "org_members", "paths_info"}


@dataclass(frozen=True)
class File:  # HubFile's fields that hub_admin reads
    path: str
    size: int
    modified: float | None = None


@dataclass(frozen=True)
class Commit:
    sha: str
    time: float
    title: str


class Fake:
    """HubClient's interface over a dict of files; ``log`` lists the methods called."""

    def __init__(self, repo_id="alice/run", *, exists=True, private=True, orgs=(), members=None):
        self.repo_id, self.budget = repo_id, Budget()
        self.private = private if exists else None
        self.files: dict[str, bytes] = {}
        self.times: dict[str, float] = {}
        self.history: list[Commit] = []
        self.orgs, self.members, self.users = list(orgs), members, {"alice", "bob", "carol"}
        self.log: list[str] = []

    def __getattribute__(self, name):
        if name in READ_ONLY | {"create_repo", "commit"}:
            object.__getattribute__(self, "log").append(name)
            object.__getattribute__(self, "budget").count_call()
        return object.__getattribute__(self, name)

    def whoami(self):
        return {"name": "alice", "orgs": self.orgs}

    def visibility(self):
        return self.private

    def create_repo(self, private=True):
        self.private = private

    def head(self):
        if self.private is None:
            raise TransportError(f"{self.repo_id} not found")
        return f"sha{len(self.history)}"

    def download(self, path, revision, max_bytes):
        return self.files.get(path)

    def commit(self, adds, deletes, message, parent=None):
        self.files.update(adds)
        self.times.update(dict.fromkeys(adds, time.time()))
        self.history.insert(0, Commit(f"sha{len(self.history) + 1}", time.time(), message))
        return self.history[0].sha

    def list_files(self, prefix, revision, with_times=False):
        return [
            File(p, len(b), self.times.get(p) if with_times else None)
            for p, b in sorted(self.files.items())
            if p.startswith(prefix + "/")
        ]

    def storage_bytes(self):
        return sum(len(b) for b in self.files.values())

    def commits(self, since=None):
        return [c for c in self.history if since is None or c.time >= since]

    def user_exists(self, name):
        return name in self.users

    def org_members(self, org):
        return self.members


def writes(fake):
    return [m for m in fake.log if m not in READ_ONLY]


# --------------------------------------------------------------------------- init (logic)


def test_init_creates_a_private_repo_with_a_readme_once():
    fake = Fake(exists=False)
    first = hub_admin.init_repo(fake)
    assert fake.private is True and first.private and not first.existed
    assert first.readme_changed and first.commit == "sha1" and len(fake.history) == 1
    readme = fake.files["README.md"].decode()
    for needle in ("global/latest.safetensors", "global/step_count.json", "delta_<n>"):
        assert needle in readme
    assert (
        "speedtronic train --config worker.yaml --role worker --node-id <id> --repo alice/run"
        in (readme)
    )
    second = hub_admin.init_repo(fake)
    assert not second.readme_changed and second.commit is None and len(fake.history) == 1
    assert "README.md is up to date" in second.actions


def test_init_dry_run_calls_only_read_only_endpoints():
    for fake in (Fake(exists=False), Fake(private=True)):
        result = hub_admin.init_repo(fake, dry_run=True)
        assert writes(fake) == [] and result.readme_changed and fake.files == {}
        assert any(a.startswith("would ") for a in result.actions)


def test_init_refuses_a_public_repo_unless_allowed():
    with pytest.raises(TransportError, match="alice/run exists and is public.*--allow-public"):
        hub_admin.init_repo(Fake(private=False))
    allowed = Fake(private=False)
    assert hub_admin.init_repo(allowed, allow_public=True).private is False
    assert allowed.private is False  # accepted as it is, never flipped
    assert hub_admin.init_repo(Fake(exists=False), public=True).private is False


def test_init_leaves_a_readme_someone_wrote_alone_and_updates_its_own():
    fake = Fake()
    fake.files["README.md"] = b"# our run\n"
    result = hub_admin.init_repo(fake)
    assert not result.readme_changed and fake.files["README.md"] == b"# our run\n"
    assert "written by someone else" in result.notes[0]
    fake.files["README.md"] = hub_admin.README_MARKER.encode() + b"\nold text"
    assert hub_admin.init_repo(fake).readme_changed
    assert b"## Who may write" in fake.files["README.md"]


def test_readme_says_who_may_write_for_orgs_and_users():
    org = hub_admin.init_repo(Fake("lab/run", exists=False, orgs=["lab"]))
    assert org.commit
    text = hub_admin.readme_text("lab/run", "org")
    assert "members of the `lab` organization with the write or admin role" in text
    assert "no write collaborators" in hub_admin.readme_text("alice/run", "user")


def test_the_config_snippet_is_a_valid_config():
    import yaml

    section = yaml.safe_load(hub_admin.config_snippet("lab/run"))
    config = SpeedtronicConfig.from_dict(section)
    assert config.distributed.repo_id == "lab/run" and config.distributed.enabled


def test_repo_ids_are_checked():
    for bad in ("run", "./dir", "a/b/c", "a/../b", "/abs/path"):
        with pytest.raises(ConfigError, match="not a Hugging Face Hub repo id"):
            hub_admin.check_repo_id(bad)


# -------------------------------------------------------------------------- grant (logic)


def test_grant_reads_org_roles_and_says_what_each_user_needs():
    members = {"alice": "admin", "bob": "write", "carol": "read", "dave": "contributor"}
    fake = Fake("lab/run", members=members)
    fake.users |= {"dave", "erin"}
    result = hub_admin.grant(fake, ["bob", "carol", "dave", "erin", "alice", "bob"])
    status = {u.user: u.status for u in result.users}
    assert status == {
        "bob": "can_write",
        "carol": "manual_step",
        "dave": "manual_step",
        "erin": "manual_step",
        "alice": "can_write",
    }
    assert result.exit_code == 3 and writes(fake) == []
    text = " ".join(result.instructions)
    assert "https://huggingface.co/organizations/lab/members" in text
    assert "carol, dave, erin" in text and "https://huggingface.co/settings/tokens" in text
    assert hub_admin.grant(Fake("lab/run", members=members), ["alice", "bob"]).exit_code == 0


def test_grant_on_a_user_repo_cannot_add_writers_and_says_so():
    result = hub_admin.grant(Fake(members=None), ["alice", "bob", "nobody"])
    by_user = {u.user: u for u in result.users}
    assert by_user["alice"].status == "can_write"
    assert by_user["bob"].status == "manual_step"
    assert by_user["nobody"].status == "error" and result.exit_code == 1
    assert "cannot give another account write access" in result.instructions[0]
    assert hub_admin.grant(Fake(members=None), ["bob"]).exit_code == 3
    with pytest.raises(TransportError, match="alice/run not found: create it with speedtronic hub"):
        hub_admin.grant(Fake(exists=False), ["bob"])
    assert hub_admin.grant(Fake(), ["bad name!"]).users[0].status == "error"


# ------------------------------------------------------------------------- status (logic)


def step_count(outer_step, updated_at, nodes=None):
    doc = {"outer_step": outer_step, "updated_at": updated_at, "weights_sha256": "0" * 64}
    return json.dumps({**doc, **({"nodes": nodes} if nodes else {})}).encode()


def test_status_reports_steps_nodes_and_budgets():
    fake = Fake()
    published = time.time() - 120
    last = repo_status.iso(published)  # as the master writes it: the header's created_at
    nodes = {"node-a": {"seq": 3, "base_outer_step": 4, "last_delta_at": last, "tokens": 9}}
    fake.commit({"global/step_count.json": step_count(7, last, nodes)}, [], "")
    fake.commit(
        {
            "nodes/node-b/delta_00000001.safetensors": b"x" * 10,
            "nodes/node-b/delta_00000002.safetensors": b"y" * 5,
            "nodes/node-b/notes.txt": b"?",
        },
        [],
        "",
    )
    report = hub_admin.RepoWatcher(fake).status()
    late = time.time() - published - 120 + 1  # what the machine's slowness added, and a second
    assert report["outer_step"] == 7 and 119 <= report["age_s"] <= 120 + late
    assert report["commits_1h"] == 2 and report["commits_limit_1h"] == 128
    assert report["pending_deltas"] == 2 and report["size_bytes"] > 15
    a, b = report["nodes"]
    assert (a["node_id"], a["pending_deltas"], a["base_outer_step"]) == ("node-a", 0, 4)
    assert a["staleness_steps"] == 3 and a["tokens"] == 9 and a["last_delta_age_s"] >= 119
    assert (b["node_id"], b["pending_deltas"], b["pending_bytes"]) == ("node-b", 2, 15)
    assert (a["delta_bytes"], b["delta_bytes"]) == (None, 5)  # the newest delta: a round's upload
    assert (report["global_bytes"], report["keyframe_bytes"]) == (None, None)
    assert b["base_outer_step"] is None and b["staleness_steps"] is None
    assert b["newest_pending_age_s"] < late and b["last_delta_at"] == b["newest_pending_at"]
    assert report["problems"] == ["1 file(s) under nodes/ are not deltas: ignored"]
    assert report["api_calls_5min"] == len(fake.log) == 8  # 2 commits + 6 calls of status


def test_status_reports_the_globals_bytes_per_round_and_its_keyframes():
    fake = Fake()
    fake.commit({"global/step_count.json": step_count(3, repo_status.iso(time.time()), {})}, [], "")
    fake.commit({"global/latest.safetensors": b"w" * 40}, [], "")
    assert hub_admin.RepoWatcher(fake).status()["global_bytes"] == 40  # full weights
    older = keyframe_path(0, "a" * 64)
    fake.commit({older: b"k" * 160, keyframe_path(2, "b" * 64): b"k" * 170}, [], "")
    report = hub_admin.RepoWatcher(fake).status()
    assert (report["global_bytes"], report["keyframe_bytes"]) == (40, 170)  # the newest
    line = hub_module._round_bytes(report)
    assert "40 B (an update; its keyframe 170 B once)" in line, line


def test_status_refetches_only_when_the_head_moved():
    fake = Fake()
    watcher = hub_admin.RepoWatcher(fake)
    empty = watcher.status()
    assert empty["outer_step"] is None and empty["age_s"] is None and empty["nodes"] == []
    fake.log.clear()
    watcher.status()
    assert fake.log == ["head"]  # one call for an unchanged repo
    fake.commit({"global/step_count.json": b"not json"}, [], "")
    assert "not valid JSON" in watcher.status()["problems"][0]


def test_times_parse_from_iso_strings_and_numbers():
    assert repo_status.unix_time("1970-01-01T00:01:00Z") == 60.0
    assert repo_status.unix_time(60) == 60.0 and repo_status.unix_time("soon") is None
    assert repo_status.unix_time(True) is None and repo_status.iso(60.0) == "1970-01-01T00:01:00Z"


# ------------------------------------------------------------- the CLI against the emulator

runner = CliRunner()
TOKEN = "hf_test_writer_7f3a9c"  # must never show up in any output


@pytest.fixture
def emu(monkeypatch, tmp_path):
    """The emulator with alice (TOKEN), an org ``lab``, and the env the CLI reads."""
    from hub_emulator import HubEmulator

    with HubEmulator(tokens={TOKEN: "alice", "hf_test_reader": "rita"}) as server:
        serve_validate_yaml(server)
        server.readonly("hf_test_reader")
        server.add_org("lab", {"alice": "admin", "bob": "write", "carol": "read"})
        server.add_user("dave")
        for key, value in {
            "HF_ENDPOINT": server.url,
            "HF_TOKEN": TOKEN,
            "HF_HOME": str(tmp_path / "hf_home"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_ETAG_TIMEOUT": "2",
        }.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def serve_validate_yaml(server) -> None:
    """huggingface_hub POSTs a README.md to /api/validate-yaml before committing it."""
    import re

    from hub_emulator import json_response

    routes = server.state.routes
    if not any("validate-yaml" in pattern.pattern for _, pattern, _ in routes):
        answer = {"errors": [], "warnings": []}
        routes.append(
            ("POST", re.compile("/api/validate-yaml$"), lambda req: json_response(answer))
        )


def hub(*args: str):
    from speedtronic.cli.app import app

    result = runner.invoke(app, ["hub", *args])
    assert TOKEN not in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return result


def one_line_error(result, code: int = 1) -> str:
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speedtronic: error: "), result.stderr
    return lines[0]


def writes_to(emu) -> list[tuple[str, str, int]]:
    return [r for r in emu.requests if r[0] not in ("GET", "HEAD")]


def test_cli_init_creates_a_private_repo_once_and_prints_the_commands(emu):
    result = hub("init", "alice/run")
    assert result.exit_code == 0, result.stderr
    repo = emu.repo("alice/run")
    assert repo.private and b"nodes/<node_id>/delta_<n>.safetensors" in repo.files["README.md"]
    assert (
        "speedtronic train --config worker.yaml --role worker --node-id <id> --repo alice/run"
        in (result.stdout)
    )
    assert "repo_id: alice/run" in result.stdout and "inner_steps:" in result.stdout
    commits = len(repo.commits)
    again = hub("init", "alice/run", "--format", "json")
    report = json.loads(again.stdout)
    assert again.exit_code == 0 and len(emu.repo("alice/run").commits) == commits
    assert report["existed"] and report["private"] and not report["readme_changed"]
    assert report["commit"] is None and report["worker_command"].endswith("--repo alice/run")


def test_cli_init_dry_run_only_reads(emu):
    result = hub("init", "lab/run", "--dry-run", "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dry_run"] and report["actions"][0] == "would create private model repo lab/run"
    assert emu.repo("lab/run") is None and writes_to(emu) == []


def test_cli_init_refuses_a_public_repo_unless_allowed(emu):
    emu.create_repo("alice/open", private=False)
    line = one_line_error(hub("init", "alice/open"))
    assert "alice/open exists and is public" in line and "--allow-public" in line
    assert hub("init", "alice/open", "--allow-public").exit_code == 0
    assert not emu.repo("alice/open").private


def test_cli_grant_exit_codes_follow_who_can_write(emu):
    emu.create_repo("lab/run", private=True)
    assert hub("grant", "lab/run", "alice", "bob").exit_code == 0
    pending = hub("grant", "lab/run", "bob", "carol", "dave")
    assert pending.exit_code == 3, pending.stderr
    assert "bob: can write" in pending.stdout and "carol: manual step" in pending.stdout
    assert "https://huggingface.co/organizations/lab/members" in pending.stdout
    unknown = hub("grant", "lab/run", "bob", "zed", "--format", "json")
    report = json.loads(unknown.stdout)
    assert unknown.exit_code == 1 and report["exit_code"] == 1
    assert [u["status"] for u in report["users"]] == ["can_write", "error"]
    emu.create_repo("alice/solo", private=True)
    solo = hub("grant", "alice/solo", "dave")
    assert solo.exit_code == 3 and "https://huggingface.co/settings/tokens" in solo.stdout
    assert writes_to(emu) == []


def test_cli_status_json_and_table(emu):
    now = time.time()
    nodes = {
        "node-a": {
            "seq": 2,
            "base_outer_step": 3,
            "last_delta_at": "2020-01-01T00:00:00Z",
            "tokens": 512,
        }
    }
    emu.create_repo("alice/run", private=True)
    count = step_count(5, repo_status.iso(now - 60), nodes)
    emu.push("alice/run", {"global/step_count.json": count})
    emu.push("alice/run", {"nodes/node-b/delta_00000004.safetensors": b"d" * 100})
    result = hub("status", "alice/run", "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    late = time.time() - now + 1  # a loaded machine's delay is not the code's: bound by it
    assert report["outer_step"] == 5 and 59 <= report["age_s"] <= 60 + late
    assert report["commits_1h"] >= 2 and report["size_bytes"] > 100
    assert report["api_calls_5min"] >= 1 and report["pending_deltas"] == 1
    a, b = report["nodes"]
    assert a == {**a, "node_id": "node-a", "base_outer_step": 3, "staleness_steps": 2}
    assert b["node_id"] == "node-b" and b["pending_bytes"] == 100 and b["last_delta_age_s"] < late
    text = hub("status", "alice/run")
    assert text.exit_code == 0 and "node-a" in text.stdout and "node-b" in text.stdout
    assert "outer step 5" in text.stdout


def test_cli_status_watch_prints_a_json_line_per_refresh_until_ctrl_c(emu, monkeypatch):
    from speedtronic.cli import hub as hub_cli

    emu.create_repo("alice/run", private=True)
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt
        if len(sleeps) == 2:
            emu.push("alice/run", {"global/step_count.json": step_count(1, "2024-01-01T00:00:00Z")})

    monkeypatch.setattr(hub_cli, "_sleep", sleep)
    before = len(emu.requests)
    result = hub("status", "alice/run", "--format", "json", "--watch", "5")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["outer_step"] for r in lines] == [None, None, 1] and sleeps == [5.0] * 3
    assert lines[1]["api_calls_5min"] == lines[0]["api_calls_5min"] + 1  # unchanged: one call
    assert len(emu.requests) > before
    assert hub("status", "alice/run", "--watch", "1").exit_code == 2  # under the 5 s floor


def test_cli_missing_repo_and_refused_tokens_are_one_line(emu, monkeypatch):
    line = one_line_error(hub("status", "alice/nope"))
    assert line.endswith("alice/nope not found: create it with speedtronic hub init alice/nope")
    assert "not found: create it" in one_line_error(hub("grant", "alice/nope", "bob"))
    monkeypatch.setenv("HF_TOKEN", "hf_test_reader")
    line = one_line_error(hub("init", "rita/run"))
    assert "rita/run" in line and "(403)" in line
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_token_value")
    line = one_line_error(hub("init", "alice/other"))
    assert "alice/other" in line and "(401)" in line and "hf_wrong_token_value" not in line
    assert "not a Hugging Face Hub repo id" in one_line_error(hub("status", "run"), code=2)


def test_the_real_process_exits_with_the_codes_and_never_imports_torch(emu):
    emu.create_repo("lab/run", private=True)
    code = (
        "import sys; sys.argv = ['speedtronic', 'hub', 'grant', 'lab/run', 'carol'];"
        "from speedtronic.cli.app import main\n"
        "try:\n    main()\nfinally:\n"
        "    print('HEAVY', [m for m in ('torch', 'safetensors') if m in sys.modules])"
    )
    out = proc_support.run([sys.executable, "-c", code], env=dict(os.environ))
    assert out.returncode == 3, out.stderr
    assert "carol: manual step" in out.stdout and "HEAVY []" in out.stdout
    assert TOKEN not in out.stdout + out.stderr


def test_help_documents_the_exit_codes():
    from speedtronic.cli.app import app

    for command, needle in (
        ("grant", "3 a manual step remains"),
        ("init", "1 Hub error or public repo refused"),
        ("status", "Ctrl-C ends --watch with 0"),
    ):
        result = runner.invoke(app, ["hub", command, "--help"], terminal_width=200)
        assert result.exit_code == 0 and needle in " ".join(result.stdout.split()), result.stdout

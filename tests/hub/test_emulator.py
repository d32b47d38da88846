"""The Hub emulator, driven by the real huggingface_hub client: every endpoint and every fault.

These tests pin down what the emulator promises the Hub tests built on it (the real client sees
the statuses, headers and error classes it would see from the Hub), and they document what the
client itself does on failures: which calls it retries and how long it sleeps.
"""

# The environment must be set before huggingface_hub is imported, hence:
# ruff: noqa: E402
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# huggingface_hub reads these at import: keep the test away from the user's cache and token.
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hf_home_")
os.environ.pop("HF_HUB_OFFLINE", None)

import httpx2
import pytest
from hub_emulator import HubEmulator, git_blob_id
from hub_emulator_lfs import pointer
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download
from huggingface_hub.errors import (
    BadRequestError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import parse_ratelimit_headers
from huggingface_hub.utils.sha import git_hash

TOKENS = {"hf_alice": "alice", "hf_bob": "bob", "hf_carol": "carol", "hf_alice_ro": "alice"}
REPO = "alice/run"


@pytest.fixture
def emu():
    with HubEmulator(TOKENS) as hub:
        hub.readonly("hf_alice_ro")
        hub.add_org("team", {"alice": "admin", "bob": "write", "carol": "read"})
        yield hub
        assert hub.errors == []


@pytest.fixture(autouse=True)
def sleeps(monkeypatch) -> list[float]:
    """The client's own backoff sleeps, recorded instead of slept (the emulator never sleeps
    through time.sleep: its delays wait on an Event)."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return slept


def api(emu: HubEmulator, token: str | bool = "hf_alice") -> HfApi:
    return HfApi(endpoint=emu.url, token=token)


def add(path: str, data: bytes) -> CommitOperationAdd:
    """A file handed over as a buffer: huggingface_hub then takes the Git LFS path for LFS
    files, as Speedtronic does (with plain bytes it takes hf_xet's, which this Hub lacks)."""
    return CommitOperationAdd(path_in_repo=path, path_or_fileobj=io.BytesIO(data))


def download(emu, path, revision="main", token="hf_alice", cache=None) -> bytes:
    cache_dir = cache or tempfile.mkdtemp(prefix="hf_cache_")
    kw = dict(revision=revision, endpoint=emu.url, token=token, cache_dir=cache_dir)
    return Path(hf_hub_download(REPO, path, **kw)).read_bytes()


def status_of(err: HfHubHTTPError) -> int:
    return err.response.status_code


# -- accounts ------------------------------------------------------------------------------------


def test_whoami_users_and_org_members(emu):
    me = api(emu).whoami()
    assert me["name"] == "alice" and me["orgs"] == [
        {"type": "org", "name": "team", "roleInOrg": "admin"}
    ]
    assert api(emu, "hf_alice_ro").whoami()["auth"]["accessToken"]["role"] == "read"
    with pytest.raises(HfHubHTTPError) as bad:
        api(emu, "hf_nobody").whoami()
    assert status_of(bad.value) == 401
    assert api(emu).get_user_overview("bob").username == "bob"
    with pytest.raises(HfHubHTTPError) as missing:
        api(emu).get_user_overview("mallory")
    assert status_of(missing.value) == 404
    members = {u.username: u.role for u in api(emu, "hf_bob").list_organization_members("team")}
    assert members == {"alice": "admin", "bob": "write", "carol": "read"}
    emu.add_user("dave", token="hf_dave")
    outsider = list(api(emu, "hf_dave").list_organization_members("team"))
    assert not hasattr(outsider[0], "role")  # roles are for members' eyes only
    with pytest.raises(HfHubHTTPError):
        list(api(emu).list_organization_members("no-such-org"))


# -- repos ---------------------------------------------------------------------------------------


def test_create_repo_visibility_and_settings(emu):
    url = api(emu).create_repo(REPO, private=True)
    assert url.repo_id == REPO and emu.repo(REPO).private
    assert api(emu).create_repo(REPO, private=True, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as conflict:
        api(emu).create_repo(REPO)
    assert status_of(conflict.value) == 409
    info = api(emu).model_info(REPO, expand=["sha", "private", "lastModified", "usedStorage"])
    assert info.sha == emu.repo(REPO).head.sha and info.private is True
    assert info.used_storage > 0 and info.last_modified is not None
    assert info.siblings is None  # only the expanded properties come back
    for token in ("hf_bob", False):  # a stranger, then nobody: the repo does not exist
        with pytest.raises(RepositoryNotFoundError):
            api(emu, token).model_info(REPO)
    api(emu).update_repo_settings(REPO, private=False)
    assert api(emu, False).model_info(REPO).private is False
    with pytest.raises(HfHubHTTPError) as readonly:
        api(emu, "hf_alice_ro").create_repo("alice/other")
    assert status_of(readonly.value) == 403
    with pytest.raises(HfHubHTTPError) as reader:
        api(emu, "hf_carol").create_repo("team/run")
    assert status_of(reader.value) == 403
    assert api(emu, "hf_bob").create_repo("team/run", private=True).repo_id == "team/run"
    assert api(emu, "hf_carol").model_info("team/run").private  # members see private org repos
    api(emu).delete_repo("team/run")
    assert emu.repo("team/run") is None


def test_grant_access_only_applies_to_gated_repos(emu):
    emu.create_repo(REPO)
    with pytest.raises(BadRequestError):
        api(emu).grant_access(REPO, "bob")
    api(emu).update_repo_settings(REPO, gated="manual")
    api(emu).grant_access(REPO, "bob")
    assert emu.repo(REPO).granted == {"bob"}


# -- commits and reads ---------------------------------------------------------------------------


def test_commit_then_read_everything_back(emu):
    emu.create_repo(REPO, private=True, files={"nodes/a/d1.pt": b"a1", "nodes/b/d1.pt": b"b1"})
    first = emu.repo(REPO).head.sha
    ops = [add("step_count.json", b'{"outer_step": 1}'), add("weights.pt", b"w" * 300)]
    ops += [CommitOperationDelete("nodes/a/d1.pt"), CommitOperationDelete("nodes/b/", True)]
    ops += [add("README.md", b"# run\n")]  # the client validates a README's YAML first
    info = api(emu).create_commit(REPO, ops, commit_message="publish 1", parent_commit=first)
    repo = emu.repo(REPO)
    assert info.oid == repo.head.sha and len(info.oid) == 40
    assert set(repo.files) == {".gitattributes", "README.md", "step_count.json", "weights.pt"}
    assert git_blob_id(b"w" * 300) == git_hash(b"w" * 300)  # the client's own git sha1

    tree = api(emu).list_repo_tree(REPO, recursive=True, expand=True)
    files = {e.path: e for e in tree}
    # *.pt is LFS (the Hub's default .gitattributes): git holds a pointer, the listing says so
    sha = hashlib.sha256(b"w" * 300).hexdigest()
    assert files["weights.pt"].blob_id == git_hash(pointer(sha, 300))
    assert (files["weights.pt"].size, files["weights.pt"].lfs.sha256) == (300, sha)
    assert files["step_count.json"].lfs is None
    assert files["weights.pt"].last_commit.oid == info.oid
    assert files[".gitattributes"].last_commit.title == "initial commit"
    old_tree = {e.path for e in api(emu).list_repo_tree(REPO, "nodes", revision=first)}
    assert old_tree == {"nodes/a", "nodes/b"}  # not recursive: folders only
    with pytest.raises(RemoteEntryNotFoundError):
        list(api(emu).list_repo_tree(REPO, "nodes"))

    found = api(emu).get_paths_info(REPO, ["weights.pt", "nodes/a/d1.pt", "gone"])
    assert [e.path for e in found] == ["weights.pt"]
    assert api(emu).model_info(REPO, revision=first).sha == first
    commits = api(emu).list_repo_commits(REPO)
    assert [c.title for c in commits] == ["publish 1", "seed", "initial commit"]

    assert download(emu, "weights.pt") == b"w" * 300
    assert download(emu, "nodes/a/d1.pt", revision=first) == b"a1"  # reads at any commit
    with pytest.raises(RemoteEntryNotFoundError):
        download(emu, "nodes/a/d1.pt")
    with pytest.raises(RevisionNotFoundError):
        download(emu, "weights.pt", revision="f" * 40)
    with pytest.raises(RepositoryNotFoundError):
        download(emu, "weights.pt", token="hf_bob")


def test_stale_parent_is_412_and_changes_nothing(emu):
    emu.create_repo(REPO)
    parent = emu.repo(REPO).head.sha
    other = emu.push(REPO, {"step_count.json": b"2"}, message="another master")
    with pytest.raises(HfHubHTTPError) as stale:
        api(emu).create_commit(REPO, [add("x", b"1")], commit_message="m", parent_commit=parent)
    assert status_of(stale.value) == 412 and emu.repo(REPO).head.sha == other


def test_client_skips_unchanged_files_and_missing_deletes_are_404(emu):
    emu.create_repo(REPO, files={"a.json": b"same"})
    head = emu.repo(REPO).head.sha
    info = api(emu).create_commit(REPO, [add("a.json", b"same")], commit_message="noop")
    # The preupload answer carries the remote oid, so the client sends no commit at all.
    assert info.oid == head and emu.count("POST", "/commit/") == 0
    with pytest.raises(RemoteEntryNotFoundError):
        api(emu).create_commit(REPO, [CommitOperationDelete("nope.pt")], commit_message="rm")


def test_write_permissions(emu):
    emu.create_repo(REPO)
    emu.create_repo("alice/secret", private=True)
    emu.create_repo("team/run")
    cases = [(False, REPO, 401), ("hf_alice_ro", REPO, 403), ("hf_bob", REPO, 403)]
    cases += [("hf_carol", "team/run", 403)]
    for token, repo_id, status in cases:
        with pytest.raises(HfHubHTTPError) as denied:
            api(emu, token).create_commit(repo_id, [add("x", b"1")], commit_message="m")
        assert status_of(denied.value) == status, (token, repo_id)
    with pytest.raises(RepositoryNotFoundError):
        api(emu, "hf_bob").create_commit("alice/secret", [add("x", b"1")], commit_message="m")
    api(emu, "hf_bob").create_commit("team/run", [add("x", b"1")], commit_message="m")
    assert emu.repo("team/run").files["x"] == b"1"


def test_super_squash_frees_storage_and_forgets_old_shas(emu):
    emu.create_repo(REPO)
    old = emu.push(REPO, {"w.pt": b"1" * 1000})
    emu.push(REPO, {"w.pt": b"2" * 1000})
    before = api(emu).model_info(REPO, expand=["usedStorage"]).used_storage
    api(emu).super_squash_history(REPO, commit_message="squash")
    assert [c.title for c in api(emu).list_repo_commits(REPO)] == ["squash"]
    assert api(emu).model_info(REPO, expand=["usedStorage"]).used_storage == before - 1000
    with pytest.raises(RevisionNotFoundError):
        api(emu).model_info(REPO, revision=old)


def test_listings_paginate_with_link_headers(emu):
    emu.create_repo(REPO, files={f"nodes/n{i}.pt": b"%d" % i for i in range(5)})
    emu.state.tree_page_size, emu.state.commits_page_size = 2, 1
    assert len(list(api(emu).list_repo_tree(REPO, "nodes", expand=True))) == 5
    assert emu.count("GET", "/tree/") == 3
    assert len(api(emu).list_repo_commits(REPO)) == 2 and emu.count("GET", "/commits/") == 2


def test_concurrent_commits_all_land(emu):
    emu.create_repo(REPO)

    def commit(i: int) -> None:
        api(emu).create_commit(REPO, [add(f"nodes/n{i}.pt", b"%d" % i)], commit_message=f"n{i}")

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    repo = emu.repo(REPO)
    assert len(repo.commits) == 9 and len(repo.files) == 9


# -- faults --------------------------------------------------------------------------------------


def test_429_carries_the_rate_limit_headers_the_client_parses(emu, sleeps):
    emu.create_repo(REPO)
    emu.faults.add(429, method="POST", path_re="/commit/", headers={"Retry-After": "7"})
    with pytest.raises(HfHubHTTPError) as limited:
        api(emu).create_commit(REPO, [add("x", b"1")], commit_message="m")
    assert status_of(limited.value) == 429 and emu.count("POST", "/commit/") == 1  # no retry
    limit = parse_ratelimit_headers(limited.value.response.headers)
    assert (limit.remaining, limit.reset_in_seconds, limit.window_seconds) == (0, 7, 300)
    assert "rate limit" in str(limited.value)
    # Listings go through http_backoff: it waits reset + 1 s, then succeeds.
    emu.faults.add(429, path_re="/tree/", headers={"Retry-After": "3"})
    assert list(api(emu).list_repo_tree(REPO))
    assert sleeps == [4.0]


def test_the_commit_budget_refuses_over_the_window_and_applies_nothing(emu):
    emu.create_repo(REPO)
    now = [1000.0]
    budget = emu.limit_commits(2, window_s=60)
    budget.clock = lambda: now[0]
    api(emu).create_commit(REPO, [add("a", b"1")], commit_message="a")
    now[0] += 10
    api(emu).create_commit(REPO, [add("b", b"2")], commit_message="b")
    head, now[0] = emu.repo(REPO).head.sha, now[0] + 5
    with pytest.raises(HfHubHTTPError) as limited:
        api(emu).create_commit(REPO, [add("c", b"3")], commit_message="c")
    assert status_of(limited.value) == 429 and budget.refused == 1
    assert emu.repo(REPO).head.sha == head and "c" not in emu.repo(REPO).files  # not applied
    limit = parse_ratelimit_headers(limited.value.response.headers)
    # "a" leaves the window 60 s after it landed: 45 s from now
    assert (limit.remaining, limit.reset_in_seconds, limit.limit, limit.window_seconds) == (
        0,
        45,
        2,
        60,
    )
    assert limited.value.response.headers["Retry-After"] == "45"
    with pytest.raises(HfHubHTTPError):  # a squash is a commit too
        api(emu).super_squash_history(REPO)
    now[0] += 45  # "a" has left the window: one commit fits again, then none
    api(emu).create_commit(REPO, [add("c", b"3")], commit_message="c")
    assert emu.repo(REPO).files["c"] == b"3" and emu.stats()["commits_refused"] == 2
    with pytest.raises(HfHubHTTPError):
        api(emu).create_commit(REPO, [add("d", b"4")], commit_message="d")
    assert "commits_refused" not in HubEmulator().stats()  # off by default


def test_server_errors_before_and_after_the_commit_lands(emu):
    emu.create_repo(REPO)
    head = emu.repo(REPO).head.sha
    emu.faults.add(503, method="POST", path_re="/commit/")
    with pytest.raises(HfHubHTTPError) as before:
        api(emu).create_commit(REPO, [add("x", b"1")], commit_message="m")
    assert status_of(before.value) == 503 and emu.repo(REPO).head.sha == head
    emu.faults.add(500, method="POST", path_re="/commit/", after_apply=True)
    with pytest.raises(HfHubHTTPError) as ambiguous:
        api(emu).create_commit(REPO, [add("x", b"1")], commit_message="landed")
    assert status_of(ambiguous.value) == 500 and emu.repo(REPO).head.title == "landed"
    emu.faults.add("timeout", method="POST", path_re="/commit/", after_apply=True)
    with pytest.raises(httpx2.RemoteProtocolError):
        api(emu).create_commit(REPO, [add("y", b"2")], commit_message="dropped")
    assert emu.repo(REPO).head.title == "dropped" and emu.requests[-1][2] == 0


def test_dropped_and_slow_answers(emu):
    emu.create_repo(REPO)
    emu.faults.add("timeout", method="POST", path_re="/commit/")
    with pytest.raises(httpx2.RemoteProtocolError):
        api(emu).create_commit(REPO, [add("x", b"1")], commit_message="m")
    assert "x" not in emu.repo(REPO).files
    emu.faults.add("timeout", path_re="/api/models/", delay_s=5)
    start = time.monotonic()
    with pytest.raises(httpx2.ReadTimeout):
        api(emu).model_info(REPO, timeout=0.2)
    emu.faults.add("slow", path_re="/api/models/", delay_s=0.3)
    assert api(emu).model_info(REPO).sha == emu.repo(REPO).head.sha
    assert 0.3 <= time.monotonic() - start < 3


def test_token_specific_auth_faults(emu):
    emu.create_repo(REPO)
    emu.faults.add(401, token="hf_bob", times=5)
    emu.faults.add(403, method="POST", token="hf_alice")
    with pytest.raises(HfHubHTTPError) as revoked:
        api(emu, "hf_bob").model_info(REPO)
    assert status_of(revoked.value) == 401
    with pytest.raises(HfHubHTTPError) as forbidden:
        api(emu).create_commit(REPO, [add("x", b"1")], commit_message="m")
    assert status_of(forbidden.value) == 403
    assert api(emu).model_info(REPO).sha  # other tokens and methods are untouched


def test_truncated_bodies_are_detected(emu, sleeps):
    emu.create_repo(REPO, files={"w.pt": bytes(range(256)) * 8})
    emu.faults.add("truncate", path_re="/api/models/")
    with pytest.raises(httpx2.RemoteProtocolError):
        api(emu).model_info(REPO)
    # w.pt is LFS: its bytes come from the storage origin. hf_hub_download notices the short
    # body itself, waits 1 s and fetches again (resuming with a Range request only past its
    # 10 MB read chunk: here nothing was kept).
    emu.storage.faults.add("truncate", method="GET")
    assert download(emu, "w.pt") == bytes(range(256)) * 8
    assert [status for m, _, status in emu.storage.requests] == [200, 200] and sleeps == [1]
    found = httpx2.get(f"{emu.url}/{REPO}/resolve/main/w.pt", follow_redirects=True)
    ranged = httpx2.get(str(found.url), headers={"Range": "bytes=2040-"})
    assert ranged.status_code == 206 and ranged.content == bytes(range(248, 256))
    assert ranged.headers["Content-Range"] == "bytes 2040-2047/2048"


def test_download_retries_head_but_not_get(emu, sleeps):
    emu.create_repo(REPO, files={"w.pt": b"w"})
    emu.faults.add(503, method="HEAD")
    assert download(emu, "w.pt") == b"w"  # a failed HEAD is retried with backoff
    assert emu.count("HEAD") == 2
    emu.storage.faults.add(500, method="GET")
    with pytest.raises(HfHubHTTPError) as failed:
        download(emu, "w.pt")  # a failed GET (from the storage) is not
    assert status_of(failed.value) == 500


def test_random_faults_are_transient_and_reproducible(emu):
    emu.create_repo(REPO, files={"w.pt": b"weights"})
    head = emu.repo(REPO).head.sha

    def poll(n: int) -> int:
        failures = 0
        for _ in range(n):
            try:
                assert api(emu).model_info(REPO, expand=["sha"]).sha == head
            except (HfHubHTTPError, httpx2.TransportError):
                failures += 1
        return failures

    emu.faults.random(0.3, seed=7)
    assert 0 < poll(40) < 40 and emu.repo(REPO).head.sha == head
    first = list(emu.faults.injected)
    assert {kind for _, _, kind in first} <= {500, 502, 503, 429, "timeout"}
    emu.faults.random(0.3, seed=7)  # the same seed replays the same faults
    poll(40)
    assert emu.faults.injected[len(first) :] == first
    emu.faults.clear()
    assert poll(5) == 0


def test_random_ambiguous_commits_land_whole_or_not_at_all(emu):
    emu.create_repo(REPO)
    emu.faults.random(0.5, seed=3, statuses=(500, "timeout"), ambiguous=True)
    answered = {}
    for i in range(16):
        try:
            api(emu).create_commit(REPO, [add(f"n{i}", b"%d" % i)], commit_message=f"n{i}")
            answered[f"n{i}"] = True
        except (HfHubHTTPError, httpx2.TransportError):
            answered[f"n{i}"] = False
    landed = [c.title for c in emu.repo(REPO).commits[1:]]
    assert {t for t, ok in answered.items() if ok} <= set(landed)
    assert any(not answered[t] for t in landed)  # some failed calls did land: ambiguous
    assert set(emu.repo(REPO).files) == {".gitattributes", *landed}


# -- the large-file side: LFS, the storage origin, no Xet ------------------------------------------

MiB = 1024 * 1024
HTTP = httpx2.Client(timeout=60)  # one: each new client builds an SSL context (~0.1 s)


def preupload(emu, files: list[dict], token="hf_alice") -> dict[str, str]:
    """path -> the upload mode the emulator answers, as huggingface_hub asks for it."""
    url = f"{emu.url}/api/models/{REPO}/preupload/main"
    r = HTTP.post(url, json={"files": files}, headers={"Authorization": f"Bearer {token}"})
    r.raise_for_status()
    return {f["path"]: f["uploadMode"] for f in r.json()["files"]}


def sample(data: bytes) -> str:
    return base64.b64encode(data[:512]).decode()


def test_preupload_answers_lfs_where_the_hub_does(emu):
    emu.create_repo(REPO)
    modes = preupload(
        emu,
        [
            {"path": "nodes/a/delta_00000001.safetensors", "sample": sample(b"{}"), "size": 2},
            {"path": "global/step_count.json", "sample": sample(b'{"a": 1}'), "size": 8},
            {"path": "notes.txt", "sample": sample(b"text"), "size": 10 * MiB},  # 10 MiB
            {"path": "raw.txt", "sample": sample(b"\0\1\2"), "size": 3},  # binary
            {"path": "empty.safetensors", "sample": "", "size": 0},
        ],
    )
    assert modes == {
        "nodes/a/delta_00000001.safetensors": "lfs",  # the Hub's default .gitattributes
        "global/step_count.json": "regular",
        "notes.txt": "lfs",
        "raw.txt": "lfs",
        "empty.safetensors": "regular",  # an empty file is never LFS
    }
    assert b"*.safetensors filter=lfs" in emu.repo(REPO).files[".gitattributes"]


def batch(emu, objects: list[dict], token="hf_alice") -> httpx2.Response:
    body = {"operation": "upload", "transfers": ["basic", "multipart"], "objects": objects}
    body["hash_algo"] = "sha256"
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.git-lfs+json"}
    return HTTP.post(f"{emu.url}/{REPO}.git/info/lfs/objects/batch", json=body, headers=headers)


def obj(data: bytes) -> dict:
    return {"oid": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_the_batch_api_signs_a_put_on_the_storage_origin_and_a_verify(emu):
    emu.create_repo(REPO)
    data = b"\0" * 100
    answer = batch(emu, [obj(data)])
    assert answer.headers["Content-Type"] == "application/vnd.git-lfs+json"
    (item,) = answer.json()["objects"]
    assert answer.json()["transfer"] == "basic"
    put, verify = item["actions"]["upload"]["href"], item["actions"]["verify"]["href"]
    assert put.startswith(emu.storage.url + "/lfs/") and "signature=" in put
    assert verify == f"{emu.url}/{REPO}.git/info/lfs/objects/verify"
    # the storage refuses the token (a second auth mechanism), a short body, a forged URL
    auth = {"Authorization": "Bearer hf_alice"}
    assert HTTP.put(put, content=data, headers=auth).status_code == 400
    short = HTTP.put(put, content=data[:50])
    assert short.status_code == 400 and b"IncompleteBody" in short.content
    forged = HTTP.put(put.replace("signature=", "signature=0"), content=data)
    assert forged.status_code == 403 and b"SignatureDoesNotMatch" in forged.content
    oid = obj(data)["oid"]
    verified = HTTP.post(verify, json=obj(data), headers=auth)
    assert verified.status_code == 404  # nothing stored yet
    assert HTTP.put(put, content=data).headers["ETag"]  # what the URL was signed for
    assert HTTP.post(verify, json=obj(data), headers=auth).status_code == 200
    assert emu.repo(REPO).lfs_objects[oid] == data
    (again,) = batch(emu, [obj(data)]).json()["objects"]
    assert "actions" not in again  # stored: the client skips the upload
    assert batch(emu, [obj(data)], token="hf_alice_ro").status_code == 403
    assert batch(emu, [obj(data)], token="hf_bob").status_code == 403


def test_signed_urls_expire(emu):
    now = [1_000_000.0]
    with HubEmulator(TOKENS, clock=lambda: now[0]) as hub:
        hub.create_repo(REPO)
        data = b"\0" * 10
        put = batch(hub, [obj(data)]).json()["objects"][0]["actions"]["upload"]["href"]
        now[0] += 3601
        expired = HTTP.put(put, content=data)
        assert expired.status_code == 403 and b"Request has expired" in expired.content


def test_the_batch_api_goes_multipart_above_its_threshold(emu):
    emu.create_repo(REPO)
    emu.state.lfs.multipart_threshold, emu.state.lfs.chunk_size = 1000, 400
    data = bytes(range(256)) * 5  # 1280 bytes: 4 parts
    answer = batch(emu, [obj(data)]).json()
    assert answer["transfer"] == "multipart"
    upload = answer["objects"][0]["actions"]["upload"]
    header = upload["header"]
    assert header["chunk_size"] == "400" and sorted(k for k in header if k.isdigit()) == list(
        "1234"
    )
    assert upload["href"].startswith(f"{emu.url}/api/complete_multipart?")
    # what huggingface_hub does with it: PUT each part, then complete with their etags
    api(emu).create_commit(REPO, [add("w.safetensors", data)], commit_message="big")
    assert emu.repo(REPO).files["w.safetensors"] == data
    parts = [p for m, p, _ in emu.storage.requests if m == "PUT"]
    assert [p.rsplit("/", 1)[-1] for p in parts[-4:]] == ["1", "2", "3", "4"]
    assert emu.count("POST", "/api/complete_multipart") == 1


def commit_raw(emu, *operations: dict, token="hf_alice") -> httpx2.Response:
    lines = [{"key": "header", "value": {"summary": "raw", "description": ""}}, *operations]
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
    return HTTP.post(f"{emu.url}/api/models/{REPO}/commit/main", content=body, headers=headers)


def test_commits_refuse_objects_never_uploaded_and_binary_inline(emu):
    emu.create_repo(REPO)
    ghost = {"path": "w.safetensors", "algo": "sha256", "oid": "a" * 64, "size": 3}
    refused = commit_raw(emu, {"key": "lfsFile", "value": ghost})
    assert refused.status_code == 400 and "never uploaded" in refused.json()["error"]
    inline = base64.b64encode(b"\0\1\2").decode()
    binary = {"path": "raw.bin", "content": inline, "encoding": "base64"}
    assert commit_raw(emu, {"key": "file", "value": binary}).status_code == 400
    text = base64.b64encode(b"{}").decode()
    tracked = {"path": "d.safetensors", "content": text, "encoding": "base64"}
    assert commit_raw(emu, {"key": "file", "value": tracked}).status_code == 400
    assert len(emu.repo(REPO).commits) == 1  # none of them landed


def test_lfs_files_are_listed_with_their_lfs_object_and_resolve_to_the_storage(emu):
    emu.create_repo(REPO, files={"w.safetensors": b"\0weights", "a.json": b"{}"})
    head = emu.repo(REPO).head.sha
    found = {e.path: e for e in api(emu).get_paths_info(REPO, ["w.safetensors", "a.json"])}
    sha = hashlib.sha256(b"\0weights").hexdigest()
    assert (found["w.safetensors"].lfs.sha256, found["w.safetensors"].size) == (sha, 8)
    assert found["w.safetensors"].blob_id == git_hash(pointer(sha, 8))
    assert found["a.json"].lfs is None and found["a.json"].blob_id == git_hash(b"{}")
    auth = {"Authorization": "Bearer hf_alice"}
    moved = HTTP.get(f"{emu.url}/{REPO}/resolve/main/w.safetensors", headers=auth)
    assert moved.status_code == 302 and moved.headers["X-Repo-Commit"] == head
    assert moved.headers["X-Linked-Size"] == "8" and moved.headers["X-Linked-Etag"] == f'"{sha}"'
    location = moved.headers["Location"]
    assert location.startswith(emu.storage.url) and "signature=" in location
    assert HTTP.get(location, headers=auth).status_code == 400  # the token stays on the Hub
    assert HTTP.get(location).content == b"\0weights"
    # httpx drops the token when a redirect leaves the origin: a client following it is served
    assert HTTP.get(moved.request.url, headers=auth, follow_redirects=True).content == b"\0weights"
    plain = HTTP.get(f"{emu.url}/{REPO}/resolve/main/a.json", headers=auth)
    assert plain.status_code == 200 and plain.content == b"{}"  # regular files: from the Hub


def test_plain_bytes_take_hf_xets_path_which_this_hub_lacks(emu):
    """What issue 18 found, in the default environment (hf_xet installed): bytes go to hf_xet,
    which asks the Hub for a Xet token with its own HTTP client; here that is a 404, and it
    surfaces as a builtin ConnectionError. The LFS path takes a buffer (io.BytesIO)."""
    from huggingface_hub import constants

    if constants.HF_HUB_DISABLE_XET:
        pytest.skip("HF_HUB_DISABLE_XET is set: huggingface_hub takes the LFS path for bytes too")
    pytest.importorskip("hf_xet")
    emu.create_repo(REPO)
    plain = CommitOperationAdd("w.safetensors", b"\0weights")
    with pytest.raises(ConnectionError, match="xet-write-token"):
        api(emu).create_commit(REPO, [plain], commit_message="m")
    assert emu.count("GET", "/xet-write-token/") >= 1 and emu.storage.requests == []
    assert len(emu.repo(REPO).commits) == 1


def test_a_failed_put_reaches_the_caller_as_the_librarys_runtime_error(emu):
    """huggingface_hub wraps an LFS upload's failure in a plain RuntimeError (the HTTP error is
    its cause), and does not retry it when the storage answers 503 (a hook of ours would
    stop the library's own retries; here there is none: it retried, then gave up)."""
    emu.create_repo(REPO)
    emu.storage.faults.add(503, method="PUT", times=10)
    with pytest.raises(RuntimeError, match="Error while uploading 'w.safetensors'") as failed:
        api(emu).create_commit(REPO, [add("w.safetensors", b"\0w")], commit_message="m")
    assert failed.value.__cause__.response.status_code == 503
    assert emu.count("POST", "/commit/") == 0  # it failed before the commit: nothing landed
    assert [s for _, _, s in emu.storage.requests] == [503] * 6  # http_backoff's 5 retries


def test_faults_on_the_storage_origin_are_its_own(emu):
    emu.create_repo(REPO, files={"w.safetensors": b"\0w"})
    emu.storage.faults.add(500, method="GET")
    location = HTTP.get(f"{emu.url}/{REPO}/resolve/main/w.safetensors").headers["Location"]
    assert HTTP.get(location).status_code == 500 and HTTP.get(location).content == b"\0w"
    stats = emu.stats()
    assert [r[2] for r in stats["storage"]["requests"]] == [500, 200]
    assert stats["storage"]["injected"] == [
        ["GET", location.split("?")[0][len(emu.storage.url) :], "500"]
    ]
    assert stats["injected"] == [] and stats["commits"][REPO] == ["initial commit", "seed"]


def test_runs_as_a_process(tmp_path):
    port_file = tmp_path / "url"
    script = Path(__file__).resolve().parents[1] / "hub_emulator.py"
    cmd = [sys.executable, str(script), "--port-file", str(port_file), "--token", "tk=zoe"]
    cmd += ["--org", "lab=zoe:admin,yan:read", "--fault-rate", "0.5", "--seed", "1"]
    cmd += ["--fault-after", "1"]  # the whoami below gets through, later calls may not
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists() and time.monotonic() < deadline:
            threading.Event().wait(0.02)
        url = port_file.read_text()
        me = HfApi(endpoint=url, token="tk").whoami()
        assert me["name"] == "zoe" and me["orgs"][0]["roleInOrg"] == "admin"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out == b"" and err == b""


def test_the_shared_fixture_serves_a_hub_any_test_file_can_use(hub_emulator):
    """conftest's ``hub_emulator``: a started emulator and a write token for alice."""
    hub_emulator.create_repo("alice/shared", private=True)
    info = HfApi(endpoint=hub_emulator.url, token=hub_emulator.token).model_info("alice/shared")
    assert info.private and hub_emulator.storage.url != hub_emulator.url

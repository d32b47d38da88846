"""A local Hugging Face Hub for tests: the HTTP API huggingface_hub 2.4 speaks, plus faults.

It owns just enough of the Hub to run the real client against it: accounts and tokens, model
repos whose history is a list of immutable snapshots (`EmuCommit`), and the REST endpoints that
`HfApi` and `hf_hub_download` call, on two origins as on the Hub: the API (`emu.url`) and the
storage LFS files live in (`emu.storage.url`, tests/hub_emulator_lfs.py), each with its own
fault plan (`emu.faults`, `emu.storage.faults`). Preupload answers "lfs" where the Hub does
(`*.safetensors` and the other patterns of the Hub's default `.gitattributes`, 10 MiB or
more, binary content), so those files take the Git LFS path: the batch API, a PUT to a signed
URL on the storage origin, verify, then a commit naming the object by `lfsFile`; commits refuse
them inline and refuse an object never uploaded. Listings show their `lfs` object; `resolve`
answers them with a 302 to the storage origin, which refuses a request carrying the token.
Other files are "regular": inline in the commit (base64 NDJSON). There is no Xet storage: the
Xet token endpoints answer 404. The wire and fault injection live in
tests/hub_emulator_faults.py. File ids are real git blob sha1s (of the pointer, for LFS
files); commit ids are 40 hex digits; reads work at "main" or at any commit sha. Dataset repos
are the same repos under the Hub's dataset URLs (`/api/datasets/...`, `/datasets/.../resolve/`),
kept under the key `datasets/<owner>/<name>` (tests/hub_emulator_datasets.py).

    with HubEmulator(tokens={"hf_w": "alice"}) as emu:
        HfApi(endpoint=emu.url, token="hf_w").create_repo("alice/run")

Also runnable as a process for end-to-end tests, serving until killed:
    python tests/hub_emulator.py --port-file F [--fault-rate 0.2 --storage-fault-rate 0.2
        --seed 1] [--token TOKEN=USER ...]
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from urllib.parse import parse_qs

from hub_emulator_budget import CommitBudget
from hub_emulator_datasets import DATASET_GITATTRIBUTES, PREFIX, dataset_routes, namespace
from hub_emulator_faults import (
    MESSAGES,
    Accounts,
    Caller,
    FaultyServer,
    Reject,
    Request,
    error_response,
    json_response,
    ranged_response,
    serve_cli,
)
from hub_emulator_lfs import HUB_GITATTRIBUTES, LfsApi, Storage, pointer, wants_lfs

WRITE_ROLES = ("admin", "write", "contributor")
REPO = r"(?P<repo>[^/]+/[^/]+)"
REV = r"(?P<rev>[^/]+)"


def git_blob_id(data: bytes) -> str:
    """The git blob sha1 the Hub reports as a regular file's oid (and ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def iso(t: float) -> str:
    """The Hub's timestamp format (what huggingface_hub.utils.parse_datetime expects)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def user_card(name: str) -> dict:
    return dict(_id=name, user=name, fullname=name, avatarUrl="", type="user", isPro=False)


@dataclass(frozen=True)
class EmuCommit:
    sha: str
    title: str
    message: str
    author: str
    time: float
    files: Mapping[str, bytes]  # immutable snapshot of the whole tree
    lfs: frozenset[str] = frozenset()  # the paths stored as LFS pointers

    def is_lfs(self, path: str) -> bool:
        return path in self.lfs


@dataclass
class EmuRepo:
    repo_id: str
    private: bool
    created: float
    commits: list[EmuCommit] = field(default_factory=list)
    gated: bool = False
    granted: set[str] = field(default_factory=set)
    lfs_objects: dict[str, bytes] = field(default_factory=dict)  # sha256 hex -> bytes
    parts: dict[str, dict[int, bytes]] = field(default_factory=dict)  # multipart, by upload id

    @property
    def head(self) -> EmuCommit:
        return self.commits[-1]

    @property
    def files(self) -> dict[str, bytes]:
        return dict(self.head.files)

    def at(self, rev: str) -> int | None:
        """Index of the commit `rev` names ("main" or a full sha), None if unknown."""
        if rev == "main":
            return len(self.commits) - 1
        return next((i for i, c in enumerate(self.commits) if c.sha == rev), None)

    def used_storage(self) -> int:
        """Bytes of every distinct blob in the history: squashing is what frees space."""
        blobs = {git_blob_id(d): len(d) for c in self.commits for d in c.files.values()}
        return sum(blobs.values())

    def last_touch(self, index: int, path: str) -> EmuCommit:
        """Newest commit up to `index` that changed `path` (a file, or a folder ending in /)."""

        def view(c: EmuCommit):
            if not path.endswith("/"):
                return c.files.get(path)
            return {p: d for p, d in c.files.items() if p.startswith(path)}

        for i in range(index, 0, -1):
            if view(self.commits[i]) != view(self.commits[i - 1]):
                return self.commits[i]
        return self.commits[0]


class HubState:
    """Repos plus the REST endpoints; each request runs under one lock (see `handle`)."""

    def __init__(self, accounts: Accounts, clock: Callable[[], float]):
        self.accounts, self.clock = accounts, clock
        self.repos: dict[str, EmuRepo] = {}
        self.lock = threading.RLock()
        self.url = ""
        self.tree_page_size = 1000  # entries per page before a Link: rel="next" header
        self.commits_page_size = 50
        self._counter = 0
        self.commit_budget: CommitBudget | None = None  # the Hub's commits per repo (off)
        self.lfs = LfsApi(self)
        api = rf"/api/models/{REPO}"
        routes = [
            ("GET", r"/api/whoami-v2", self.whoami),
            ("POST", r"/api/repos/create", self.create_repo),
            ("POST", r"/api/validate-yaml", self.validate_yaml),
            ("DELETE", r"/api/repos/delete", self.delete_repo),
            ("GET", rf"{api}(?:/revision/{REV})?", self.model_info),
            ("PUT", rf"{api}/settings", self.settings),
            ("GET", rf"{api}/tree/{REV}(?:/(?P<path>.+))?", self.tree),
            ("POST", rf"{api}/paths-info/{REV}", self.paths_info),
            ("POST", rf"{api}/preupload/{REV}", self.preupload),
            ("POST", rf"{api}/commit/{REV}", self.commit),
            ("GET", rf"{api}/commits/{REV}", self.list_commits),
            ("POST", rf"{api}/super-squash/{REV}", self.squash),
            ("POST", rf"{api}/user-access-request/grant", self.grant),
            ("GET", r"/api/users/(?P<name>[^/]+)/overview", self.user_overview),
            ("GET", r"/api/organizations/(?P<org>[^/]+)/members", self.org_members),
            ("GET", rf"/{REPO}/resolve/{REV}/(?P<path>.+)", self.resolve),
            ("HEAD", rf"/{REPO}/resolve/{REV}/(?P<path>.+)", self.resolve),
            *self.lfs.routes(),
            *dataset_routes(self),
        ]
        self.routes = [(m, re.compile(p + "$"), fn) for m, p, fn in routes]

    def handle(self, req: Request) -> tuple[int, dict[str, str], bytes]:
        for method, pattern, fn in self.routes:
            match = pattern.match(req.path)
            if match and method == req.method:
                try:
                    with self.lock:
                        req.caller = self.accounts.caller(req.headers.get("Authorization"))
                        return fn(req, **match.groupdict())
                except Reject as err:
                    return error_response(err)
        return error_response(Reject(404, f"Not found: {req.method} {req.path}"))

    # -- access --------------------------------------------------------------------------------

    def read_repo(self, req: Request, repo_id: str, rev: str | None = None) -> EmuRepo:
        """The repo if the caller may see it (private repos do not exist for outsiders)."""
        repo, caller = self.repos.get(repo_id), req.caller
        ns = namespace(repo_id)
        if repo and (not repo.private or (caller and self.accounts.role(caller.user, ns))):
            if rev is not None and repo.at(rev) is None:
                raise Reject(404, f"Invalid rev id: {rev}", "RevisionNotFound")
            return repo
        # Anonymous callers get 401 (as on the Hub); the client maps both to RepositoryNotFound.
        raise Reject(401 if caller is None else 404, "Repository not found", "RepoNotFound")

    def write_repo(self, req: Request, repo_id: str, rev: str | None = None) -> EmuRepo:
        if req.caller is None:
            raise Reject(401, "You must be authenticated to write to a repository")
        repo = self.read_repo(req, repo_id, rev)
        self.check_write(req.caller, namespace(repo_id), repo_id)
        return repo

    def check_write(self, caller: Caller, namespace: str, what: str) -> None:
        if caller.readonly:
            raise Reject(403, f"Forbidden: this token is read-only; {what} needs a write token")
        if self.accounts.role(caller.user, namespace) not in WRITE_ROLES:
            raise Reject(403, f"Forbidden: {caller.user} has no write access to {what}")

    # -- storage -------------------------------------------------------------------------------

    def add_commit(
        self, repo: EmuRepo, files: dict, title: str, author: str, msg="", lfs=frozenset()
    ) -> str:
        """A new head with `files`; `lfs` names those stored as LFS pointers."""
        self._counter += 1
        parent = repo.commits[-1].sha if repo.commits else ""
        digest = hashlib.sha1(f"{repo.repo_id}\n{parent}\n{title}\n{self._counter}".encode())
        for path in sorted(files):
            digest.update(f"{path}\0{git_blob_id(files[path])}\n".encode())
        snap, lfs = MappingProxyType(dict(files)), frozenset(p for p in lfs if p in files)
        commit = EmuCommit(digest.hexdigest(), title, msg, author, self.clock(), snap, lfs)
        repo.commits.append(commit)
        if self.commit_budget is not None:
            self.commit_budget.spend(repo.repo_id)
        return repo.head.sha

    def check_budget(self, repo_id: str) -> None:
        """A commit over the repo's budget is refused with a 429, before anything applies."""
        if self.commit_budget is not None:
            self.commit_budget.check(repo_id)

    def push_files(self, repo: EmuRepo, files: dict, title: str, author: str) -> str:
        """Commit a whole tree as a git client would: LFS-worthy files as stored objects."""
        attributes = files.get(".gitattributes")
        lfs = {p for p, d in files.items() if wants_lfs(p, d, len(d), attributes)}
        for path in lfs:
            repo.lfs_objects[hashlib.sha256(files[path]).hexdigest()] = files[path]
        return self.add_commit(repo, files, title, author, lfs=lfs)

    def new_repo(self, repo_id: str, private: bool, author: str) -> EmuRepo:
        repo = EmuRepo(repo_id, private, self.clock())
        # A new Hub repo is not empty: its first commit adds .gitattributes.
        attributes = DATASET_GITATTRIBUTES if repo_id.startswith(PREFIX) else HUB_GITATTRIBUTES
        self.add_commit(repo, {".gitattributes": attributes}, "initial commit", author)
        self.repos[repo_id] = repo
        return repo

    def entry(self, repo: EmuRepo, index: int, path: str, expand: bool) -> dict:
        """One tree / paths-info entry: a file, or a folder when `path` has files below it."""
        commit = repo.commits[index]
        files = commit.files
        lfs = None
        if path in files:
            oid, size, kind = git_blob_id(files[path]), len(files[path]), "file"
            if commit.is_lfs(path):  # git holds the pointer; the listing says what it points to
                sha = hashlib.sha256(files[path]).hexdigest()
                blob = pointer(sha, size)
                oid, lfs = git_blob_id(blob), {"oid": sha, "size": size, "pointerSize": len(blob)}
        else:
            folder = path + "/"
            below = sorted((p, git_blob_id(d)) for p, d in files.items() if p.startswith(folder))
            oid, size, kind = hashlib.sha1(repr((path, below)).encode()).hexdigest(), 0, "directory"
        out = {"type": kind, "oid": oid, "size": size, "path": path}
        if lfs is not None:
            out["lfs"] = lfs
        if expand:
            last = repo.last_touch(index, path if kind == "file" else path + "/")
            out["lastCommit"] = {"id": last.sha, "title": last.title, "date": iso(last.time)}
        return out

    def paged(self, req: Request, items: list, size: int):
        """Answer one page; a GitHub-style `Link: <...>; rel="next"` header points at the rest."""
        start = int(req.query.get("cursor", ["0"])[0])
        headers = {}
        if start + size < len(items):
            query = "".join(f"{k}={v[0]}&" for k, v in req.query.items() if k != "cursor")
            link = f"{self.url}{req.raw_path}?{query}cursor={start + size}"
            headers["Link"] = f'<{link}>; rel="next"'
        return json_response(items[start : start + size], headers=headers)

    # -- accounts ------------------------------------------------------------------------------

    def whoami(self, req: Request):
        if req.caller is None:
            raise Reject(401, MESSAGES[401])
        user = req.caller.user
        orgs = [{"type": "org", "name": o, "roleInOrg": r} for o, r in self.accounts.orgs_of(user)]
        token = {"displayName": "emulator", "role": "read" if req.caller.readonly else "write"}
        auth = {"type": "access_token", "accessToken": token}
        return json_response({**user_card(user), "name": user, "orgs": orgs, "auth": auth})

    def user_overview(self, req: Request, name: str):
        if name not in self.accounts.users:
            raise Reject(404, "User not found")
        orgs = [{"name": o} for o, _ in self.accounts.orgs_of(name)]
        num_models = sum(1 for r in self.repos if r.startswith(name + "/"))
        return json_response({**user_card(name), "numModels": num_models, "orgs": orgs})

    def org_members(self, req: Request, org: str):
        if org not in self.accounts.orgs:
            raise Reject(404, "Organization not found")
        members = self.accounts.orgs[org]
        # The Hub shows each member's role only to people inside the org.
        show_role = req.caller is not None and req.caller.user in members
        cards = [{**user_card(u), "isFollowing": False} for u in sorted(members)]
        if show_role:
            cards = [{**card, "role": members[card["user"]]} for card in cards]
        return json_response(cards)

    # -- repos ---------------------------------------------------------------------------------

    def create_repo(self, req: Request):
        body = req.json()
        if req.caller is None:
            raise Reject(401, "You must be authenticated to create a repository")
        kind = body.get("type") or "model"
        if kind not in ("model", "dataset"):
            raise Reject(400, "The Hub emulator only knows model and dataset repos")
        owner = body.get("organization") or req.caller.user
        repo_id = f"{owner}/{body['name']}"
        key = PREFIX + repo_id if kind == "dataset" else repo_id  # the URL path too
        self.check_write(req.caller, owner, f"the namespace {owner}")
        if key in self.repos:
            url = {"url": f"{self.url}/{key}"}  # create_repo(exist_ok=True) reads it
            raise Reject(409, f"You already created this {kind} repo", body=url)
        private = body.get("visibility") == "private" or bool(body.get("private"))
        self.new_repo(key, private, req.caller.user)
        return json_response({"url": f"{self.url}/{key}", "name": repo_id, "id": repo_id})

    def delete_repo(self, req: Request):
        body = req.json()
        owner = body.get("organization") or (req.caller.user if req.caller else "")
        repo_id = f"{owner}/{body['name']}"
        repo_id = PREFIX + repo_id if body.get("type") == "dataset" else repo_id
        self.write_repo(req, repo_id)
        del self.repos[repo_id]
        return json_response({})

    def validate_yaml(self, req: Request):  # create_commit posts a README.md here first
        return json_response({"errors": [], "warnings": []})

    def model_info(self, req: Request, repo: str, rev: str | None = None):
        emu_repo = self.read_repo(req, repo, rev or "main")
        commit = emu_repo.commits[emu_repo.at(rev or "main")]
        siblings = [{"rfilename": p} for p in sorted(commit.files)]
        if req.flag("blobs"):
            for s in siblings:
                data = commit.files[s["rfilename"]]
                s.update(size=len(data), blobId=git_blob_id(data))
        info = {"_id": repo, "id": repo, "author": repo.split("/")[0], "sha": commit.sha}
        info.update(lastModified=iso(commit.time), createdAt=iso(emu_repo.created))
        info.update(private=emu_repo.private, gated="manual" if emu_repo.gated else False)
        info.update(disabled=False, downloads=0, likes=0, tags=[], siblings=siblings)
        info.update(usedStorage=emu_repo.used_storage())
        expand = req.query.get("expand") or req.query.get("expand[]")
        if expand:  # only the properties asked for, as the Hub does
            info = {k: v for k, v in info.items() if k in ("_id", "id", *expand)}
        return json_response(info)

    def settings(self, req: Request, repo: str):
        emu_repo, body = self.write_repo(req, repo), req.json()
        if "visibility" in body:
            emu_repo.private = body["visibility"] == "private"
        if "private" in body:
            emu_repo.private = bool(body["private"])
        if "gated" in body:
            emu_repo.gated = body["gated"] not in (False, None)
        return json_response({})

    def grant(self, req: Request, repo: str):
        emu_repo, user = self.write_repo(req, repo), req.json().get("user", "")
        if not emu_repo.gated:  # grant_access is about gated repos, not write access
            raise Reject(400, "This repository is not gated: access requests do not apply")
        if user not in self.accounts.users:
            raise Reject(404, f"User {user} not found")
        emu_repo.granted.add(user)
        return json_response({})

    # -- reads ---------------------------------------------------------------------------------

    def tree(self, req: Request, repo: str, rev: str, path: str | None = None):
        emu_repo = self.read_repo(req, repo, rev)
        index = emu_repo.at(rev)
        base = (path or "").strip("/")
        prefix = base + "/" if base else ""
        paths: set[str] = set()
        for file in emu_repo.commits[index].files:
            if file.startswith(prefix):
                parts = file[len(prefix) :].split("/")
                depth = len(parts) if req.flag("recursive") else 1
                paths.update(prefix + "/".join(parts[: i + 1]) for i in range(depth))
        if base and not paths:
            raise Reject(404, f"Entry not found: {base} at {rev}", "EntryNotFound")
        entries = [self.entry(emu_repo, index, p, req.flag("expand")) for p in sorted(paths)]
        entries.sort(key=lambda e: (e["type"] != "directory", e["path"]))
        return self.paged(req, entries, self.tree_page_size)

    def paths_info(self, req: Request, repo: str, rev: str):
        emu_repo = self.read_repo(req, repo, rev)
        index = emu_repo.at(rev)
        form = parse_qs(req.body.decode())  # form-encoded, not JSON: paths=a&paths=b&expand=True
        expand = form.get("expand", ["false"])[0].lower() == "true"
        files = emu_repo.commits[index].files
        out = []
        for path in dict.fromkeys(p.strip("/") for p in form.get("paths", [])):
            if path in files or any(f.startswith(path + "/") for f in files):
                out.append(self.entry(emu_repo, index, path, expand))
        return json_response(out)

    def resolve(self, req: Request, repo: str, rev: str, path: str):
        emu_repo = self.read_repo(req, repo, rev)
        commit = emu_repo.commits[emu_repo.at(rev)]
        if path not in commit.files:  # X-Repo-Commit lets the client cache the absence
            raise Reject(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit.sha})
        data = commit.files[path]
        if commit.is_lfs(path):  # the bytes are on the storage origin: redirect there, signed
            sha = hashlib.sha256(data).hexdigest()
            headers = {"Location": self.lfs.download_url(repo, sha), "X-Repo-Commit": commit.sha}
            headers.update({"X-Linked-Size": str(len(data)), "X-Linked-Etag": f'"{sha}"'})
            headers["ETag"] = f'"{git_blob_id(pointer(sha, len(data)))}"'
            return 302, headers, b"Found. Redirecting to the storage"
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        headers.update({"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": commit.sha})
        return ranged_response(req, headers, data)

    def list_commits(self, req: Request, repo: str, rev: str):
        emu_repo = self.read_repo(req, repo, rev)
        items = []
        for c in reversed(emu_repo.commits[: emu_repo.at(rev) + 1]):  # newest first
            item = {"id": c.sha, "title": c.title, "message": c.message, "date": iso(c.time)}
            items.append({**item, "authors": [{"user": c.author, "avatar": ""}]})
        return self.paged(req, items, self.commits_page_size)

    # -- writes --------------------------------------------------------------------------------

    def preupload(self, req: Request, repo: str, rev: str):
        emu_repo = self.write_repo(req, repo, rev)
        head = emu_repo.commits[emu_repo.at(rev)]
        attributes = head.files.get(".gitattributes")
        files = []
        for item in req.json().get("files", []):
            path, sample = item["path"], base64.b64decode(item.get("sample", ""))
            lfs = wants_lfs(path, sample, int(item.get("size", 0)), attributes)
            answer = {"path": path, "uploadMode": "lfs" if lfs else "regular"}
            answer["shouldIgnore"] = False
            if path in head.files:  # the client then skips files that did not change
                data = head.files[path]
                stored_lfs = head.is_lfs(path)
                answer["oid"] = (
                    hashlib.sha256(data).hexdigest() if stored_lfs else git_blob_id(data)
                )
            files.append(answer)
        return json_response({"files": files, "commitOid": head.sha})

    def commit(self, req: Request, repo: str, rev: str):
        emu_repo = self.write_repo(req, repo)
        if rev != "main":
            raise Reject(400, f"Cannot commit to {rev}: the emulator only has the main branch")
        lines = [json.loads(line) for line in req.body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise Reject(400, "The commit payload must start with a header line")
        header = lines[0]["value"]
        parent = header.get("parentCommit")
        if parent and parent != emu_repo.head.sha:
            raise Reject(412, MESSAGES[412])
        self.check_budget(emu_repo.repo_id)
        files, lfs = dict(emu_repo.head.files), set(emu_repo.head.lfs)
        attributes = files.get(".gitattributes")
        for line in lines[1:]:
            apply_operation(files, lfs, line["key"], line["value"], emu_repo.lfs_objects)
            path = line["value"].get("path", "").strip("/")
            data = files.get(path)
            if line["key"] == "file" and wants_lfs(path, data, len(data), attributes):
                raise Reject(
                    400, f"{path}: binary or LFS-tracked content must be uploaded with LFS"
                )
        sha = self.add_commit(
            emu_repo, files, header["summary"], req.caller.user, header.get("description", ""), lfs
        )
        url = f"{self.url}/{repo}/commit/{sha}"
        return json_response({"success": True, "commitOid": sha, "commitUrl": url})

    def squash(self, req: Request, repo: str, rev: str):
        emu_repo = self.write_repo(req, repo)
        head, message = emu_repo.head, req.json().get("message") or "Super-squash"
        self.check_budget(emu_repo.repo_id)
        emu_repo.commits = []  # older shas stop resolving, as on the Hub
        sha = self.add_commit(emu_repo, dict(head.files), message, "", lfs=head.lfs)
        return json_response({"commitId": sha})


def apply_operation(files: dict, lfs: set, key: str, value: dict, objects: dict) -> None:
    """Apply one NDJSON commit operation to a working copy of the tree (`lfs`: its LFS paths;
    `objects`: the repo's stored LFS objects, by sha256)."""
    path = value.get("path", "").strip("/")
    if not path or ".." in path.split("/"):
        raise Reject(400, f"Invalid path in commit: {path!r}")
    if key == "file":
        files[path] = base64.b64decode(value["content"])
        lfs.discard(path)
    elif key == "lfsFile":
        data = objects.get(str(value.get("oid")))
        if value.get("algo", "sha256") != "sha256" or data is None:
            raise Reject(400, f"{path}: LFS object {value.get('oid')} was never uploaded")
        if value.get("size") is not None and value["size"] != len(data):
            raise Reject(400, f"{path}: LFS object {value['oid']} is not {value['size']} bytes")
        files[path] = data
        lfs.add(path)
    elif key == "deletedFile":
        if files.pop(path, None) is None:
            raise Reject(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
        lfs.discard(path)
    elif key == "deletedFolder":
        doomed = [p for p in files if p.startswith(path + "/")]
        if not doomed:
            raise Reject(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
        for p in doomed:
            del files[p]
            lfs.discard(p)
    else:
        raise Reject(400, f"Unsupported commit operation {key!r}")


class HubEmulator(FaultyServer):
    """A Hub on 127.0.0.1:<free port>, as a context manager (or `start()` / `close()`)."""

    def __init__(self, tokens: dict[str, str] | None = None, *, clock=time.time):
        self.accounts = Accounts({"hf_test_writer": "alice"} if tokens is None else tokens)
        self.state = HubState(self.accounts, clock)
        super().__init__(self.state.handle)
        self.state.url = self.url
        self.storage = Storage(self.state, self.state.lfs)  # the second origin

    def start(self):
        self.storage.start()
        return super().start()

    def close(self) -> None:
        super().close()
        self.storage.close()

    def hurry(self) -> None:
        super().hurry()
        self.storage.hurry()

    def stats(self) -> dict:
        """Both origins' requests and faults, and each repo's commit titles, as JSON."""
        with self.state.lock:
            commits = {r: [c.title for c in repo.commits] for r, repo in self.state.repos.items()}
        budget = self.state.commit_budget
        refused = {"commits_refused": budget.refused} if budget is not None else {}
        return {**super().stats(), "storage": self.storage.stats(), "commits": commits, **refused}

    # -- accounts ------------------------------------------------------------------------------

    def limit_commits(self, limit: int, window_s: float = 3600.0) -> CommitBudget:
        """Refuse commits beyond ``limit`` per repo in any ``window_s`` (the Hub: ~128/hour)."""
        self.state.commit_budget = CommitBudget(limit, window_s, self.state.clock)
        return self.state.commit_budget

    def add_user(self, name: str, token: str | None = None) -> None:
        with self.state.lock:
            self.accounts.users.add(name)
            if token:
                self.accounts.tokens[token] = name

    def add_org(self, org: str, members: dict[str, str] | None = None) -> None:
        """`members` maps user -> role: "admin", "write", "contributor" or "read"."""
        with self.state.lock:
            self.accounts.orgs[org] = dict(members or {})
            self.accounts.users.update(members or {})

    def readonly(self, token: str) -> None:
        with self.state.lock:
            self.accounts.readonly_tokens.add(token)

    # -- repos, directly (no HTTP, no faults) --------------------------------------------------

    def repo(self, repo_id: str) -> EmuRepo | None:
        return self.state.repos.get(repo_id)

    def create_repo(self, repo_id: str, *, private: bool = False, files=None) -> EmuRepo:
        """A repo as `hub init` would leave it; `files` are pushed after, as by git (LFS-worthy
        ones stored as objects). A dataset repo is named `datasets/<owner>/<name>` here (and in
        `repo` / `push`), as in its URLs."""
        with self.state.lock:
            repo = self.state.new_repo(repo_id, private, namespace(repo_id))
            if files:
                self.push(repo_id, files, message="seed")
            return repo

    def push(self, repo_id: str, adds: dict[str, bytes], deletes=(), message="push") -> str:
        """Commit to main as the owner would from elsewhere (e.g. a concurrent writer)."""
        with self.state.lock:
            repo = self.state.repos[repo_id]
            files = {p: d for p, d in repo.head.files.items() if p not in set(deletes)}
            files.update(adds)
            return self.state.push_files(repo, files, message, namespace(repo_id))


if __name__ == "__main__":
    sys.exit(serve_cli(HubEmulator))

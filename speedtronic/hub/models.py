"""Model repos on the Hub: create one and upload a model directory to it in one commit.

``push_folder`` is what ``speedtronic export --push`` runs: the repo is created when missing
(private unless asked otherwise; an existing repo keeps its visibility), then every file of
the export goes up in a single commit through ``HubClient``, under the request policy,
retries, error classes, budget and token handling every Hub feature shares; the weights
travel the Git LFS path, read from disk as they upload, and the commit lands exactly once
(``commits.Commits``). Files of the repo that the export does not have are left alone.

``download_model`` is ``speedtronic import``'s reading side: a model repo's revision pinned to
its commit, and the files import reads (config, safetensors weights and their index, tokenizer
files; never a pickle) fetched through ``RepoFiles`` into ``<cache>/<sha>/``, where a second
import finds them without a download. Once every file is there, a listing of the commit is kept
beside them (``LISTING``): a revision given as that full commit sha then needs no request at
all, and works offline, as a pinned dataset file does.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from speedtronic.errors import ConfigError
from speedtronic.hub.client import HubClient
from speedtronic.hub.datasets import RepoFiles
from speedtronic.hub.names import is_hub_repo_id


@dataclass(frozen=True)
class Pushed:
    repo_id: str
    url: str
    commit: str
    created: bool  # the repo was created by this push
    private: bool | None  # its visibility now (None: not visible to this token)


def check_model_repo_id(repo_id: str) -> str:
    if not is_hub_repo_id(repo_id):
        raise ConfigError(
            f"--push: {repo_id!r} is not a Hugging Face Hub repo id: use owner/name, e.g. "
            "my-name/my-model"
        )
    return repo_id


def push_folder(
    folder: Path,
    files: list[str],
    repo_id: str,
    *,
    private: bool = True,
    message: str = "Upload model (speedtronic export)",
    client: HubClient | None = None,
    endpoint: str | None = None,
) -> Pushed:
    """Create ``repo_id`` if it is missing and commit ``files`` of ``folder`` to it at once."""
    check_model_repo_id(repo_id)
    client = client or HubClient(repo_id, endpoint=endpoint)
    visibility = client.visibility()
    created = visibility is None
    if created:
        client.create_repo(private=private)
        visibility = private
    sha = client.commit({name: folder / name for name in files}, [], message)
    return Pushed(repo_id, f"{client.endpoint}/{repo_id}", sha, created, visibility)


# What import reads from a model repo; pickled weights (*.bin, *.pt) are never fetched.
WANTED_FILES = frozenset(
    "config.json generation_config.json model.safetensors.index.json tokenizer.json "
    "tokenizer_config.json special_tokens_map.json chat_template.jinja".split()
)


LISTING = ".speedtronic-listing.json"  # no wanted file starts with a dot
_SHA = re.compile(r"[0-9a-f]{40}")


def wanted(path: str) -> bool:
    return path in WANTED_FILES or ("/" not in path and path.endswith(".safetensors"))


def download_model(
    repo_id: str, revision: str, cache: Path, endpoint: str | None = None
) -> tuple[Path, str, list[str]]:
    """The files import reads of ``repo_id`` at ``revision``, in ``cache/<sha>/``: (folder,
    sha, every file the repo holds at that commit, for the caller's messages)."""
    if _SHA.fullmatch(revision):
        cached = _cached(Path(cache) / revision)
        if cached is not None:  # a commit never changes: no request needed
            return Path(cache) / revision, revision, cached
    files = RepoFiles(repo_id, "model", endpoint=endpoint)
    sha = files.resolve(revision)
    listed = files.list_files(sha)
    folder = Path(cache) / sha
    for file in listed:
        if wanted(file.path):
            files.download(file, sha, folder / file.path)
    paths = [f.path for f in listed]
    _keep_listing(folder, paths)
    return folder, sha, paths


def _keep_listing(folder: Path, paths: list[str]) -> None:
    """Say that every wanted file of the commit is in ``folder`` (written last, renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{LISTING}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"files": paths}), encoding="utf-8")
    os.replace(tmp, folder / LISTING)


def _cached(folder: Path) -> list[str] | None:
    """The commit's file listing, when the cache holds every wanted file of it; else None."""
    from speedtronic.readlimit import MIB, read_json

    try:
        paths = read_json(folder / LISTING, 16 * MIB)["files"]
    except (ConfigError, TypeError, KeyError):
        return None
    ok = isinstance(paths, list) and all(isinstance(p, str) for p in paths)
    if not ok or not all((folder / p).is_file() for p in paths if wanted(p)):
        return None
    return paths

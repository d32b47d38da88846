"""Hub sources: ``hf://datasets/...`` listed at one commit, downloaded a bounded few ahead.

Through the project's one Hub client (``speedtronic.hub.datasets.RepoFiles``): the same request
policy, retries (429 with its reset, 5xx, dropped or cut answers, storage faults), request
budget and token handling as the DiLoCo transport. The token is ``HF_TOKEN`` or the stored login;
``HF_ENDPOINT`` points at another Hub (the tests' emulator).

- ``hub_inputs``: the revision pinned to its commit sha (a resumed tokenize reads the same
  snapshot), the files under the pattern's folder listed, those of a known format that match
  kept in path order. Nothing matching is a one-line error listing a few files that are there.
- ``Downloads``: the file being tokenized and up to ``ahead`` more are fetched by a small thread
  pool (resumed with ``Range`` after a cut, checked against the listing's sha256), into a cache
  folder; without ``--cache-dir`` each file is deleted once its tokens are committed, so the disk
  holds a few source files, not the corpus.
- ``hub_file``: one model-repo file such as ``hf://openai-community/gpt2/tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from speedtronic.data.ingest.spec import InputFile, check_repo, file_format, matches, parse_hub
from speedtronic.errors import DataError

AHEAD = 2  # files downloaded beyond the one being tokenized
CLIENT_OPTIONS: dict = {}  # extra RepoFiles arguments (tests: a sleep that does not wait)


_BUDGET: list = []  # the process's one Budget: every listing and download counts in it


def _client(repo: str, kind: str = "dataset"):
    from speedtronic.hub.budget import Budget
    from speedtronic.hub.datasets import RepoFiles

    if not _BUDGET:
        _BUDGET.append(Budget())
    # HF_ENDPOINT read now, not when huggingface_hub was first imported
    endpoint = os.environ.get("HF_ENDPOINT") or None
    return RepoFiles(repo, kind, endpoint=endpoint, budget=_BUDGET[0], **CLIENT_OPTIONS)


def requests_made() -> dict:
    """Hub API calls and storage requests this process made in the last hour."""
    if not _BUDGET:
        return {"hub_calls": 0, "hub_storage_requests": 0}
    return {"hub_calls": _BUDGET[0].calls(3600), "hub_storage_requests": _BUDGET[0].storage(3600)}


def hub_inputs(source: str) -> list[InputFile]:
    spec = parse_hub(source)
    client = _client(spec.repo)
    sha = client.resolve(spec.revision)
    listed = client.list_files(sha, spec.literal_prefix)
    picked = [f for f in listed if matches(spec.pattern, f.path) and file_format(f.path)]
    if not picked:
        there = ", ".join(f.path for f in listed[:5]) or "no files"
        what = repr(spec.pattern) if spec.pattern else "any file"
        raise DataError(
            f"{source}: nothing in hf://datasets/{spec.repo}@{sha[:12]} matches {what} in a known "
            f"format (there: {there}{', ...' if len(listed) > 5 else ''})"
        )
    return [
        InputFile(
            name=f"hf://datasets/{spec.repo}@{sha}/{f.path}",
            format=file_format(f.path),
            size=f.size,
            repo=spec.repo,
            revision=sha,
            repo_path=f.path,
            sha256=f.sha256,
            oid=f.oid,
        )
        for f in picked
    ]


class Downloads:
    """Hub files fetched in order, ``ahead`` beyond the current one, at most that many at once."""

    def __init__(self, files: list[InputFile], folder: Path, keep: bool, ahead: int = AHEAD):
        self.files, self.folder, self.keep, self.ahead = files, folder, keep, ahead
        self._pool = ThreadPoolExecutor(max_workers=max(1, ahead), thread_name_prefix="download")
        self._started: dict[int, Future] = {}
        self._stop = threading.Event()  # set by close: downloads no one will read end now

    def where(self, file: InputFile) -> Path:
        return self.folder / file.repo.replace("/", "--") / file.revision / file.repo_path

    def ready(self, index: int) -> bool:
        """Whether file ``index`` is downloaded already (no wait)."""
        started = self._started.get(index)
        return started is not None and started.done()

    def local(self, index: int) -> tuple[str, str]:
        """File ``index``'s local path and sha256, waiting for its download; starts the next."""
        for i in range(index, min(len(self.files), index + self.ahead + 1)):
            if i not in self._started and self.files[i].on_hub:
                self._started[i] = self._pool.submit(self._fetch, self.files[i])
        return self._started[index].result()

    def _fetch(self, file: InputFile) -> tuple[str, str]:
        from speedtronic.hub.files import HubFile

        dest = self.where(file)
        listed = HubFile(file.repo_path, file.size, file.oid or "", file.sha256, None)
        digest = _client(file.repo).download(listed, file.revision, dest, self._stop)
        return str(dest), digest

    def release(self, index: int) -> None:
        """File ``index`` is tokenized and committed: drop its copy unless caching."""
        if not self.keep and self.files[index].on_hub:
            self.where(self.files[index]).unlink(missing_ok=True)

    def close(self, finished: bool) -> None:
        """Stop downloading; a finished run drops its download folder (unless caching), an
        unfinished one keeps it for the rerun (a part-downloaded file resumes)."""
        self._stop.set()  # e.g. --max-tokens reached while later files were downloading
        self._pool.shutdown(wait=True, cancel_futures=True)
        if finished and not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def hub_file(source: str, dest: Path) -> dict:
    """``hf://OWNER/MODEL[@REVISION]/PATH`` downloaded to ``dest``; where it came from."""

    parts = source.removeprefix("hf://").split("/")
    if len(parts) < 3 or parts[0] == "datasets":
        raise DataError(f"{source}: a Hub file is hf://OWNER/MODEL[@REVISION]/PATH")
    name, _, revision = parts[1].partition("@")
    repo, path = check_repo(source, f"{parts[0]}/{name}"), _repo_path(source, parts[2:])
    client = _client(repo, "model")
    sha = client.resolve(revision or "main")
    listed = [f for f in client.list_files(sha, path.rpartition("/")[0]) if f.path == path]
    if not listed:
        raise DataError(f"{source}: no file {path} in {repo} at {sha[:12]}")
    digest = client.download(listed[0], sha, dest)
    return {"source": f"hf://{repo}@{sha}/{path}", "sha256": digest, "size_bytes": listed[0].size}


def cached_hub_file(source: str, base: str | Path | None = None) -> Path:
    """``hf://OWNER/MODEL[@REVISION]/PATH`` in the user cache (``<cache>/models/<owner>--<name>/
    <sha>/PATH``): one request to pin the revision, a download only the first time."""
    from platformdirs import user_cache_dir

    parts = source.removeprefix("hf://").split("/")
    if len(parts) < 3 or parts[0] == "datasets":
        raise DataError(f"{source}: a Hub file is hf://OWNER/MODEL[@REVISION]/PATH")
    name, _, revision = parts[1].partition("@")
    repo, path = check_repo(source, f"{parts[0]}/{name}"), _repo_path(source, parts[2:])
    sha = _client(repo, "model").resolve(revision or "main")
    root = Path(base or user_cache_dir("speedtronic"), "hub", "models", repo.replace("/", "--"))
    dest = root / sha / path
    if not dest.is_file():
        hub_file(f"hf://{repo}@{sha}/{path}", dest)
    return dest


def _repo_path(source: str, parts: list[str]) -> str:
    if any(p in ("", ".", "..") or "\\" in p for p in parts):
        raise DataError(f"{source}: not a plain path inside the repo")
    return "/".join(parts)


def cached_dataset_file(source: str, base: str | Path | None = None) -> tuple[Path, str]:
    """``hf://datasets/OWNER/NAME[@REVISION]/PATH`` in the user cache (``<cache>/hub/datasets/
    <owner>--<name>/<sha>/PATH``), and the source pinned to that sha. The file's listing entry
    is recorded beside the cache (``.listing/<sha>/PATH.json``) at its download, and every use
    checks the cached bytes against it (sha256, or git blob id): a commit sha already cached
    needs no request (it works offline); an edited copy is fetched anew, or refused."""
    from platformdirs import user_cache_dir

    parts = source.removeprefix("hf://").split("/")
    if len(parts) < 4 or parts[0] != "datasets":
        raise DataError(f"{source}: a Hub dataset file is hf://datasets/OWNER/NAME[@REVISION]/PATH")
    name, _, revision = parts[2].partition("@")
    repo, path = f"{parts[1]}/{name}", _repo_path(source, parts[3:])
    root = Path(base or user_cache_dir("speedtronic"), "hub", "datasets", repo.replace("/", "--"))
    listed = _recorded(root, revision, path) if len(revision) == 40 else None
    if listed is not None:
        return _checked(repo, listed, revision, root / revision / path), _pinned(
            repo, revision, path
        )
    client = _client(repo, "dataset")
    sha = client.resolve(revision or "main")
    listed = _recorded(root, sha, path)
    if listed is None:
        found = [f for f in client.list_files(sha, path.rpartition("/")[0]) if f.path == path]
        if not found:
            raise DataError(f"{source}: no file {path} in datasets/{repo} at {sha[:12]}")
        listed = found[0]
    client.download(listed, sha, root / sha / path)  # checks a cached copy, fetches a bad one
    _record(root, sha, listed)
    return root / sha / path, _pinned(repo, sha, path)


def _pinned(repo: str, sha: str, path: str) -> str:
    return f"hf://datasets/{repo}@{sha}/{path}"


def _checked(repo: str, listed, sha: str, dest: Path) -> Path:
    """``dest`` once its bytes are the listing's: no request when they are; an edited or
    damaged copy is downloaded again, and refused in one line when the Hub cannot be reached."""
    from speedtronic.errors import SpeedtronicError

    try:
        _client(repo, "dataset").download(listed, sha, dest)
    except SpeedtronicError as exc:
        pinned = _pinned(repo, sha, listed.path)
        raise DataError(
            f"{dest}: the cached copy does not match the listing of {pinned} (sha256) and "
            f"cannot be fetched again: {exc}"
        ) from None
    return dest


def _listing_path(root: Path, sha: str, path: str) -> Path:
    return root / ".listing" / sha / f"{path}.json"  # beside the commits: no repo file's name


def _record(root: Path, sha: str, listed) -> None:
    target = _listing_path(root, sha, listed.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    entry = {"size": listed.size, "oid": listed.oid, "sha256": listed.sha256}
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, target)


def _recorded(root: Path, sha: str, path: str):
    """The listing entry recorded at the download, None if none (or one that is not ours)."""
    from speedtronic.hub.files import HubFile
    from speedtronic.readlimit import read_json

    where = _listing_path(root, sha, path)
    if not where.is_file():
        return None
    try:
        entry = read_json(where, 4096)
        size, oid, digest = entry["size"], entry["oid"], entry["sha256"]  # type: ignore[index]
    except (DataError, KeyError, TypeError):
        return None  # unreadable: list the file again
    if not (
        isinstance(size, int) and isinstance(oid, str) and isinstance(digest, (str, type(None)))
    ):
        return None
    return HubFile(path, size, oid, digest, None)

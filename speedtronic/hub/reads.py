"""Single read requests to one Hub repo, each sent once: the policy around them does the retrying.

``Reads`` owns how each read is asked and how its answer is checked: the repo's info (its
head sha, privacy, storage), ``paths-info``, one page of a listing (``Link: rel="next"`` names
the next one), and a file's bytes, whose size is checked against the cap from the headers before
the body is read and whose body is checked against ``Content-Length`` after (a short body is
``Transient``). Listings and downloads are requests of our own on the library's session rather
than ``paginate`` and ``hf_hub_download``, which would retry (and sleep) on their own.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub import utils as hf_utils
from huggingface_hub.hf_api import RepoFile

from speedtronic.hub.budget import Budget
from speedtronic.hub.classify import Classifier
from speedtronic.hub.errors import HubError, Transient
from speedtronic.hub.files import HubFile
from speedtronic.hub.policy import RequestPolicy
from speedtronic.hub.session import origin
from speedtronic.hub.wording import Op, Wording


def connect(
    repo_id: str,
    wording: Wording,
    endpoint: str | None,
    token: str | None,
    budget: Budget,
    **limits: Any,
) -> tuple[RequestPolicy, Reads]:
    """What every Hub client of one repo opens: its request policy (``limits``: max_attempts,
    max_backoff_s, timeout_s, sleep) and its reads, on one ``HfApi`` for ``endpoint``."""
    api = HfApi(endpoint=endpoint, token=token, library_name="speedtronic")
    policy = RequestPolicy(Classifier(repo_id, wording, origin(api.endpoint)), budget, **limits)
    return policy, Reads(api, repo_id, token, limits["timeout_s"], wording)


class Reads:
    """One request each, for ``repo_id`` on ``api``'s endpoint, answered or raised."""

    def __init__(self, api: HfApi, repo_id: str, token: str | None, timeout_s: float, wording):
        self.api, self.repo_id, self.timeout_s = api, repo_id, timeout_s
        self.endpoint = api.endpoint.rstrip("/")
        self._token = token  # None: huggingface_hub resolves HF_TOKEN or the stored login
        self._wording: Wording = wording

    def info(self, field: str) -> Any:
        return self.api.model_info(self.repo_id, expand=[field], timeout=self.timeout_s)

    def head(self) -> str:
        return self.info("sha").sha  # expand=["sha"]: the cheapest answer that names it

    def paths_info(self, paths: list[str], revision: str) -> dict[str, HubFile]:
        entries = self.api.get_paths_info(self.repo_id, list(paths), revision=revision)
        return {e.path: hub_file(e) for e in entries if isinstance(e, RepoFile)}

    def page(self, url: str, params) -> tuple[list, str | None]:
        """One page of a listing, and the URL of the next one (None at the end)."""
        r = hf_utils.get_session().get(
            url, params=params, headers=self._headers(), timeout=self.timeout_s
        )
        hf_utils.hf_raise_for_status(r)
        return r.json(), r.links.get("next", {}).get("url")

    def fetch(self, path: str, revision: str, max_bytes: int) -> bytes:
        """``path``'s bytes at ``revision``; over ``max_bytes`` is a HubError (413), never read."""
        url = hf_hub_url(self.repo_id, path, revision=revision, endpoint=self.endpoint)
        session = hf_utils.get_session()
        with session.stream("GET", url, headers=self._headers(), timeout=self.timeout_s) as r:
            hf_utils.hf_raise_for_status(r)
            length = r.headers.get("Content-Length", "")
            size = int(length) if length.isdigit() else None
            data = bytearray()
            if size is None or size <= max_bytes:  # else refused before reading the body
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > max_bytes:
                        break
        if (found := max(len(data), size or 0)) > max_bytes:  # a bad file, not a bad node
            detail = f"{found} bytes, over the {max_bytes} byte cap; not downloaded"
            op = Op(f"{path} at {revision[:12]} in", self.repo_id)
            raise HubError(self._wording.message(op, 413, detail))
        if size is not None and len(data) != size:
            raise Transient(None, f"truncated download of {path}: {len(data)} of {size} bytes")
        return bytes(data)

    def _headers(self) -> dict[str, str]:
        headers = hf_utils.build_hf_headers(token=self._token, library_name="speedtronic")
        headers["Accept-Encoding"] = "identity"  # Content-Length is then the body's true size
        return headers


def hub_file(entry: RepoFile) -> HubFile:
    modified = entry.last_commit.date.timestamp() if entry.last_commit else None
    sha256 = entry.lfs.sha256 if entry.lfs else None
    return HubFile(entry.path, entry.size, entry.blob_id, sha256, modified)

"""The Hub emulator's dataset repos: the same repos, API and storage, under the Hub's dataset URLs.

A dataset repo lives beside the model repos in the emulator's state under the key
``datasets/<owner>/<name>`` (a model and a dataset may share an id, as on the Hub), and is
answered where huggingface_hub 2.4 asks for it with ``repo_type="dataset"``:

- ``GET /api/datasets/<id>[/revision/<rev>]``: ``dataset_info`` (``expand=sha`` and the rest);
- ``GET /api/datasets/<id>/tree/<rev>[/<path>]``: ``list_repo_tree`` / ``list_repo_files``,
  paginated with ``Link: rel="next"`` like the model listing;
- ``POST /api/datasets/<id>/paths-info/<rev>``, ``preupload``, ``commit``, ``commits``;
- ``GET|HEAD /datasets/<id>/resolve/<rev>/<path>``: the bytes; LFS files (``*.parquet``,
  ``*.gz``, ``*.zst``, ``*.arrow`` and the rest of the Hub's dataset ``.gitattributes``, or 10 MiB
  and more, or binary) are a 302 to the storage origin, which serves them under
  ``/lfs/datasets/<id>/<sha256>`` with Range support and its own fault plan;
- ``POST /datasets/<id>.git/info/lfs/objects/batch`` and ``verify``: uploads, as for models.

Every handler is the model repo's own (tests/hub_emulator.py) given the prefixed key, so access
rules (private repos look absent, anonymous callers get 401), faults and pagination are the same.
"""

from __future__ import annotations

import json

from hub_emulator_faults import Request, json_response
from hub_emulator_lfs import HUB_GITATTRIBUTES

PREFIX = "datasets/"
REPO = r"(?P<repo>[^/]+/[^/]+)"
REV = r"(?P<rev>[^/]+)"
# A new dataset repo's .gitattributes: the model one plus the media types datasets hold.
DATASET_GITATTRIBUTES = (
    HUB_GITATTRIBUTES
    + "".join(
        f"{p} filter=lfs diff=lfs merge=lfs -text\n"
        for p in "*.mds *.lz4 *.mp3 *.ogg *.wav *.flac *.png *.jpg *.jpeg *.webp *.mp4".split()
    ).encode()
)


def namespace(key: str) -> str:
    """The owner of a repo key (``datasets/alice/corpus`` and ``alice/run`` -> ``alice``)."""
    return key.removeprefix(PREFIX).split("/")[0]


def dataset_routes(state) -> list:
    """The dataset URLs, each the model handler on the ``datasets/``-prefixed key."""

    def on(handler):
        return lambda req, repo, **kw: handler(req, PREFIX + repo, **kw)

    api = rf"/api/datasets/{REPO}"
    lfs = r"/datasets/(?P<repo>[^/]+/[^/]+?)\.git/info/lfs/objects"

    def dataset_info(req, key, rev=None):
        return info(state, req, key, rev)

    return [
        ("GET", rf"{api}(?:/revision/{REV})?", on(dataset_info)),
        ("GET", rf"{api}/tree/{REV}(?:/(?P<path>.+))?", on(state.tree)),
        ("POST", rf"{api}/paths-info/{REV}", on(state.paths_info)),
        ("POST", rf"{api}/preupload/{REV}", on(state.preupload)),
        ("POST", rf"{api}/commit/{REV}", on(state.commit)),
        ("GET", rf"{api}/commits/{REV}", on(state.list_commits)),
        ("GET", rf"/datasets/{REPO}/resolve/{REV}/(?P<path>.+)", on(state.resolve)),
        ("HEAD", rf"/datasets/{REPO}/resolve/{REV}/(?P<path>.+)", on(state.resolve)),
        ("POST", rf"{lfs}/batch", on(state.lfs.batch)),
        ("POST", rf"{lfs}/verify", on(state.lfs.verify)),
    ]  # fmt: skip


def info(state, req: Request, key: str, rev: str | None):
    """``dataset_info``: the model answer with the dataset's own id and card fields."""
    status, headers, body = state.model_info(req, key, rev)
    doc = json.loads(body)
    repo_id = key.removeprefix(PREFIX)
    for field in ("_id", "id"):
        if field in doc:
            doc[field] = repo_id
    if "author" in doc:
        doc["author"] = namespace(key)
    return json_response(doc, status, headers)

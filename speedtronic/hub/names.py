"""The Hub's naming rule for repo ids (``owner/name``), for every layer that must tell one apart.

Stdlib only: the composition root (``distributed.repos``) uses it to recognise a Hub repo
spec, and ``hub.admin`` to refuse a bad one, without loading ``huggingface_hub``; the messages
about a repo that cannot be reached say, with ``no_directory_note``, that no such directory is
here either (a mistyped relative path reads as a Hub repo id).
"""

from __future__ import annotations

import os
import re

# A Hub repo id: owner/name, each 1-96 of the characters the Hub allows
HUB_REPO_RE = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def is_hub_repo_id(repo: str) -> bool:
    """``owner/name`` as the Hub spells repo ids (no ``..``, no ``--``)."""
    return bool(HUB_REPO_RE.fullmatch(repo)) and ".." not in repo and "--" not in repo


def no_directory_note(repo: str) -> str | None:
    """For a spec read as a Hub repo id that is no path here: the words that say so, as
    ``no_such_dir/fleet`` (a mistyped relative path) and ``my-org/my-run`` are spelled alike;
    None for anything else."""
    if not is_hub_repo_id(repo) or os.path.lexists(repo):
        return None
    return f"no directory {repo} here: a directory is written ./{repo} or as an absolute path"

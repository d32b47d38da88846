"""The Hub's naming rule for repo ids (``owner/name``), for every layer that must tell one apart.

Stdlib only: the composition root (``distributed.repos``) uses it to recognise a Hub repo
spec, and ``hub.admin`` to refuse a bad one, without loading ``huggingface_hub``.
"""

from __future__ import annotations

import re

# A Hub repo id: owner/name, each 1-96 of the characters the Hub allows
HUB_REPO_RE = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def is_hub_repo_id(repo: str) -> bool:
    """``owner/name`` as the Hub spells repo ids (no ``..``, no ``--``)."""
    return bool(HUB_REPO_RE.fullmatch(repo)) and ".." not in repo and "--" not in repo

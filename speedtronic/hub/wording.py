"""How the Hub client words a failure: one line, ``<node>: <what> <subject> (<status>): <detail>``.

``Op`` says what a call is for (so its errors can say what failed, and whether it writes);
``Wording`` builds the line, keeps only the first line of a server's message, cuts it to 200
characters and replaces any token in it, so no message, log line or hint ever holds one. Stdlib
only: the token it scrubs besides its own comes from a callable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """What a call is for, to word its errors: ``<what> <subject> (<status>): <detail>``."""

    what: str
    subject: str
    write: bool = False


class Wording:
    """One-line messages for one node's calls; never shows ``token`` nor ``stored_token()``."""

    def __init__(self, node_id: str, token: str | None, stored_token: Callable[[], str | None]):
        self.node_id = node_id
        self._token, self._stored_token = token, stored_token

    def message(self, op: Op, status: int | str | None, detail: str, what=None) -> str:
        prefix = f"{self.node_id}: " if self.node_id else ""
        code = status if status is not None else "no answer"
        return self.scrub(f"{prefix}{what or op.what} {op.subject} ({code}): {detail}")

    def detail(self, text: str) -> str:
        """The first non-empty line of ``text``, scrubbed, at most 200 characters."""
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
        first = self.scrub(first)  # before cutting: a token across the cut would survive it
        return first if len(first) <= 200 else first[:197] + "..."

    def scrub(self, text: str) -> str:
        for secret in {self._token, self._stored_token()} - {None, ""}:
            text = text.replace(secret, "<token>")
        return text

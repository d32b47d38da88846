"""Hooks on huggingface_hub's shared HTTP session, for the requests a Hub client's call makes.

The library sends every request through one shared ``httpx2.Client`` (``get_session``) and
retries some of them itself, sleeping for real. Inside a client's call (``active(policy)``),
the hooks here count each request in the client's ``Budget``, give it the client's timeout
(the library sets none), and raise at once on a retryable status, so no retry loop of the
library's runs under the client's own policy. Requests of anyone else on the shared session
(no active call in that context) pass untouched. The hooks are installed through the
library's client factory, so every session it makes anew (after connection errors, in forked
children) carries them too.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
from huggingface_hub import utils as hf_utils

# The policy (budget, timeout) of the call running in this context, if any
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("hub", default=None)
_HOOK_LOCK = threading.Lock()
_LIBRARY_HOOKS: list = []  # the library's own request hooks, kept in our sessions


@contextlib.contextmanager
def active(policy: Any) -> Iterator[None]:
    """Requests made inside are ``policy``'s: counted in its ``budget``, given its timeout."""
    hook_session()
    token = _ACTIVE.set(policy)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _on_request(request: httpx2.Request) -> None:
    policy = _ACTIVE.get()
    if policy is not None:  # else someone else's request on the shared session
        policy.budget.count_call()
        if all(v is None for v in (request.extensions.get("timeout") or {}).values()):
            request.extensions["timeout"] = httpx2.Timeout(policy.timeout_s).as_dict()


def _on_response(response: httpx2.Response) -> None:
    status = response.status_code
    if _ACTIVE.get() is not None and (status in (408, 429) or status >= 500):
        hf_utils.hf_raise_for_status(response)  # ours to retry: stops the library's own loops


def hook_session() -> None:
    """Make every session the library creates (it makes new ones after connection errors and
    forks) carry the hooks, through its client factory: one without them has no timeout."""
    with _HOOK_LOCK:
        if not _LIBRARY_HOOKS:
            hooks = hf_utils.get_session().event_hooks["request"]
            _LIBRARY_HOOKS.extend(h for h in hooks if h is not _on_request)
            hf_utils.set_client_factory(_hooked_client)  # the next get_session makes one


def _hooked_client() -> httpx2.Client:
    hooks = {"request": [*_LIBRARY_HOOKS, _on_request], "response": [_on_response]}
    return httpx2.Client(event_hooks=hooks, follow_redirects=True, timeout=None)

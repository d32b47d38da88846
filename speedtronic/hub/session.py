"""Hooks on huggingface_hub's shared HTTP session, for the requests a Hub client's call makes.

The library sends every request through one shared ``httpx2.Client`` (``get_session``) and
retries some of them itself, sleeping for real. Inside one attempt of a client's call
(``attempt(policy)``) every request on that session, to the Hub's API origin or to another one
(the storage an LFS upload is PUT to, the CDN a download is redirected to), is counted in the
client's ``Budget`` (API calls and storage requests apart), given the policy's timeout (the
library sets none; the policy's is shorter until the Hub has answered once, and its response
hook is what tells the policy that it has), and its failure reaches the client's policy at
once: a retryable status raises in a response hook, and a network error is wrapped
(``NetworkFailure``) on its way out of the transport, so no retry loop of the library's
(``http_backoff``) runs under the client's own. The attempt also records whether the commit
request went out: only after it can a failure have landed. Requests of anyone else on the
shared session (no attempt in that context) pass untouched. The hooks are installed through
the library's client factory, so every session it makes anew (in forked children, say) carries
them too.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
from huggingface_hub import utils as hf_utils

NETWORK = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
_HOOK_LOCK = threading.Lock()
_LIBRARY_HOOKS: list = []  # the library's own request hooks, kept in our sessions


@dataclass
class Attempt:
    """One try of a client's call: its policy (budget, timeout, API origin) and whether its
    commit request was sent."""

    policy: Any
    commit_sent: bool = False


class NetworkFailure(Exception):
    """A network error of an attempt's request, out of reach of the library's retry loops
    (they catch httpx2's own classes); the error itself is its ``__cause__``."""


_ACTIVE: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("hub", default=None)


@contextlib.contextmanager
def attempt(policy: Any) -> Iterator[Attempt]:
    """Requests made inside are ``policy``'s: counted in its ``budget``, given its timeout."""
    hook_session()
    current = Attempt(policy)
    token = _ACTIVE.set(current)
    try:
        yield current
    finally:
        _ACTIVE.reset(token)


def current() -> Attempt | None:
    """The attempt running in this context, if any."""
    return _ACTIVE.get()


def origin(url: Any) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL: requests to the API origin are API calls."""
    parsed = httpx2.URL(str(url))
    return parsed.scheme, parsed.host, parsed.port


def _on_request(request: httpx2.Request) -> None:
    current = _ACTIVE.get()
    if current is None:  # someone else's request on the shared session
        return
    policy = current.policy
    if origin(request.url) == policy.api_origin:
        policy.budget.count_call()
        if request.method == "POST" and "/commit/" in request.url.path:
            current.commit_sent = True
    else:  # the storage an LFS object goes to, the CDN a download is redirected to
        policy.budget.count_storage()
    limit = policy.request_timeout_s()
    asked = request.extensions.get("timeout") or {}
    if all(v is None for v in asked.values()):
        request.extensions["timeout"] = httpx2.Timeout(limit).as_dict()
    else:  # the caller's own timeout, but never past the policy's
        request.extensions["timeout"] = {k: min(v or limit, limit) for k, v in asked.items()}


def _on_response(response: httpx2.Response) -> None:
    current, status = _ACTIVE.get(), response.status_code
    if current is None:
        return
    current.policy.heard()
    if status in (408, 429) or status >= 500:
        hf_utils.hf_raise_for_status(response)  # ours to retry: stops the library's own loops


class _Stream(httpx2.SyncByteStream):
    """A response body whose network errors, inside an attempt, become ``NetworkFailure``."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except NETWORK as exc:
            _escape(exc)
            raise

    def close(self) -> None:
        self._inner.close()


class _Transport(httpx2.BaseTransport):
    """The connection pool, its network errors kept from the library's retry loops (see the
    module's docstring). Behind a proxy from the environment httpx sends through a proxy
    transport this one does not wrap: the library may then retry a dropped connection
    itself before the policy sees it (counting and timeouts still apply: they are hooks)."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = self._inner.handle_request(request)
        except NETWORK as exc:
            _escape(exc)
            raise
        response.stream = _Stream(response.stream)
        return response

    def close(self) -> None:
        self._inner.close()


def _escape(exc: BaseException) -> None:
    """Inside an attempt, raise ``exc`` as a ``NetworkFailure``; else let it go on as it is."""
    if _ACTIVE.get() is not None:
        raise NetworkFailure(f"{type(exc).__name__}: {exc}") from exc


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
    return httpx2.Client(
        event_hooks=hooks, follow_redirects=True, timeout=None, transport=_Transport()
    )

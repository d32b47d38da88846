"""The Hub emulator's HTTP wire (requests, callers, answers) and the faults it acts out on it.

`Handler` reads a request, asks the `FaultPlan` whether to misbehave, routes it to the emulator's
state (tests/hub_emulator.py) and writes the answer in the Hub's error shape; `Accounts` turns
the Authorization header into a `Caller`; `FaultyServer` runs it all on a free local port. A
`FaultPlan` holds scripted faults (`add`) and an optional seeded random plan (`random`); each
fault is one of:

- an HTTP status (429, 5xx, 412, 401, 403, 404, ...): answered with the Hub's error shape; a 429
  carries `Retry-After` plus the IETF `RateLimit` / `RateLimit-Policy` headers that
  huggingface_hub parses (`"api";r=0;t=N` and `"fixed window";"api";q=Q;w=W`);
- "slow": wait `delay_s`, then answer normally;
- "timeout": wait `delay_s`, then close the connection without answering;
- "truncate": handle the request, then send the full Content-Length (at least 1) but only half
  the body, and close (a commit lands, a download is cut short).

With `after_apply=True` the request is handled first (a commit lands) and only then fails: the
ambiguous case a careful client must resolve by looking at the repo before repeating itself.
The same wire serves both of the emulator's origins (the Hub's API and its storage), each
with a plan of its own. Request bodies may come with a Content-Length or chunked.
"""

from __future__ import annotations

import argparse
import json
import random as _random
import re
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

DROP = "timeout"
SLOW = "slow"
TRUNCATE = "truncate"
# Kinds a random plan may draw: each leaves the server state as if the request never came
# (or, for ambiguous commits, as if it fully succeeded), never half-applied.
TRANSIENT = (500, 502, 503, 429, DROP)
# ... plus answers cut short: a plan drawing these must accept that a commit lands (ambiguous)
LOST_ANSWERS = (*TRANSIENT, TRUNCATE)
# Requests that change the repo: a random truncation of one is a drop before it, unless the
# plan lets commits land ambiguously
_STATEFUL = ("/commit/", "/super-squash/", "/repos/create", "/settings")

MESSAGES = {
    401: "Invalid credentials in Authorization header",
    403: "Forbidden: you don't have the rights to perform this operation",
    404: "Repository not found",
    409: "Conflict",
    412: "A commit has happened since. Please refresh and try again.",
    429: "You have been rate-limited; you can retry later.",
}


def rate_limit_headers(
    reset_s: int, *, resource: str = "api", limit: int = 1000, window_s: int = 300
):
    """The headers a rate-limited Hub answer carries (what utils/_http.py parses)."""
    return {
        "Retry-After": str(reset_s),
        "RateLimit": f'"{resource}";r=0;t={reset_s}',
        "RateLimit-Policy": f'"fixed window";"{resource}";q={limit};w={window_s}',
    }


@dataclass
class Fault:
    """One injected failure; `times` counts the matching requests it still hits."""

    kind: int | str
    method: str | None = None
    path_re: re.Pattern | None = None
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    after_apply: bool = False
    token: str | None = None
    hits: int = 0

    def matches(self, method: str, path: str, token: str | None) -> bool:
        if self.times <= 0 or (self.method and self.method.upper() != method):
            return False
        if self.token is not None and token != self.token:
            return False
        return self.path_re is None or self.path_re.search(path) is not None

    def response_headers(self, path: str) -> dict[str, str]:
        """Headers for a status fault; a 429 gets the rate-limit trio unless overridden."""
        if self.kind != 429:
            return dict(self.headers)
        reset = int(self.headers.get("Retry-After", "0") or 0)
        resource = "resolvers" if "/resolve/" in path else "api"
        return {**rate_limit_headers(reset, resource=resource), **self.headers}


class FaultPlan:
    """Thread-safe list of scripted faults plus an optional seeded random plan."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._rng: _random.Random | None = None
        self._rate = 0.0
        self._statuses: tuple = TRANSIENT
        self._skip = 0
        self._ambiguous = False
        self.injected: list[tuple[str, str, int | str]] = []  # (method, path, kind) per fault hit

    def add(
        self,
        status: int | str,
        *,
        method: str | None = None,
        path_re: str | None = None,
        times: int = 1,
        headers: dict[str, str] | None = None,
        delay_s: float = 0.0,
        after_apply: bool = False,
        token: str | None = None,
    ) -> Fault:
        """Fail the next `times` requests matching `method`, `path_re` (a regex search) and
        `token` (the bearer token sent; e.g. a 401 for one node whose token was revoked)."""
        if isinstance(status, str) and status not in (DROP, SLOW, TRUNCATE):
            raise ValueError(f"unknown fault kind {status!r}")
        if after_apply and status in (SLOW, TRUNCATE):
            raise ValueError("after_apply takes an HTTP status or 'timeout'")
        fault = Fault(
            kind=status,
            method=method,
            path_re=re.compile(path_re) if path_re else None,
            times=times,
            headers=dict(headers or {}),
            delay_s=delay_s,
            after_apply=after_apply,
            token=token,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def random(
        self,
        rate: float,
        *,
        seed: int,
        statuses: tuple = TRANSIENT,
        after: int = 0,
        ambiguous: bool = False,
    ) -> None:
        """Fail each request with probability `rate`, after letting the first `after` through.

        `ambiguous=True` lets half of the 5xx/drops drawn for commits land first (after_apply).
        """
        with self._lock:
            self._rng = _random.Random(seed)
            self._rate, self._statuses, self._skip = rate, tuple(statuses), after
            self._ambiguous = ambiguous

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._rng = None

    def pending(self) -> int:
        """How many scripted hits are still armed."""
        with self._lock:
            return sum(f.times for f in self._faults)

    def take(self, method: str, path: str, token: str | None = None) -> Fault | None:
        """The fault for this request, if any (scripted ones first, in the order added)."""
        with self._lock:
            fault = next((f for f in self._faults if f.matches(method, path, token)), None)
            if fault is None:
                fault = self._draw(method, path)
            else:
                fault.times -= 1
            if fault is not None:
                fault.hits += 1
                self.injected.append((method, path, fault.kind))
            return fault

    def _draw(self, method: str, path: str) -> Fault | None:
        if self._rng is None:
            return None
        if self._skip > 0:
            self._skip -= 1
            return None
        if self._rng.random() >= self._rate:
            return None
        kind = self._rng.choice(self._statuses)
        is_commit = method == "POST" and "/commit/" in path
        if kind == TRUNCATE and any(p in path for p in _STATEFUL):
            kind = TRUNCATE if is_commit and self._ambiguous else DROP
        landed = self._ambiguous and is_commit and kind not in (429, TRUNCATE)
        return Fault(kind=kind, after_apply=landed and self._rng.random() < 0.5)


# -- the wire ------------------------------------------------------------------------------------


class Reject(Exception):
    """An error answer: status, message, and the X-Error-Code the client maps to an error class."""

    def __init__(self, status: int, message: str, code=None, headers=None, body=None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.body = body or {}  # extra JSON fields, e.g. the 409's "url" that exist_ok reads


@dataclass
class Request:
    method: str
    path: str  # percent-decoded, without the query
    raw_path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes
    caller: Caller | None = None  # set by the state once the token is checked

    def json(self) -> dict:
        try:
            return json.loads(self.body or b"{}")
        except ValueError as err:
            raise Reject(400, f"Invalid JSON body: {err}") from err

    def flag(self, name: str) -> bool:
        return self.query.get(name, ["false"])[0].lower() in ("true", "1")


@dataclass(frozen=True)
class Caller:
    user: str
    readonly: bool


class Accounts:
    """Users, organisations (user -> role) and tokens (token -> user)."""

    def __init__(self, tokens: dict[str, str]):
        self.tokens = dict(tokens)
        self.readonly_tokens: set[str] = set()
        self.users: set[str] = set(tokens.values())
        self.orgs: dict[str, dict[str, str]] = {}

    def caller(self, authorization: str | None) -> Caller | None:
        """Who sent the request; an unknown token is a 401 everywhere, as on the Hub."""
        if not authorization:
            return None
        token = authorization.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise Reject(401, MESSAGES[401])
        return Caller(self.tokens[token], token in self.readonly_tokens)

    def role(self, user: str, namespace: str) -> str | None:
        return "admin" if user == namespace else self.orgs.get(namespace, {}).get(user)

    def orgs_of(self, user: str) -> list[tuple[str, str]]:
        return [(org, m[user]) for org, m in sorted(self.orgs.items()) if user in m]


def ranged_response(req: Request, headers: dict, data: bytes):
    """200 with ``data``, or 206 with the part a ``Range: bytes=N-[M]`` GET asks for (how
    huggingface_hub resumes a download cut short)."""
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", req.headers.get("Range") or "")
    if req.method == "GET" and match and data:
        start, end = int(match[1]), int(match[2] or len(data) - 1)
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return 206, headers, data[start : end + 1]
    return 200, headers, data


def json_response(obj, status: int = 200, headers: dict | None = None):
    return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(obj).encode()


def error_response(err: Reject):
    """The Hub's error shape: JSON `{"error": ...}` plus X-Error-Message / X-Error-Code."""
    headers = {"X-Error-Message": err.message, **err.headers}
    if err.code:
        headers["X-Error-Code"] = err.code
    return json_response({"error": err.message, **err.body}, err.status, headers)


def fault_response(fault: Fault, path: str):
    code = "RepoNotFound" if fault.kind == 404 else None
    message = MESSAGES.get(fault.kind, f"Injected error {fault.kind}")
    return error_response(Reject(fault.kind, message, code, fault.response_headers(path)))


class Handler(BaseHTTPRequestHandler):
    """Read the request, consult the fault plan, route it, answer (or misbehave)."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub: the client pools connections
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stall
    emu = None  # the HubEmulator, set on a subclass per server

    def log_message(self, format, *args):  # quiet: tests read `emu.requests` instead
        pass

    def _read_body(self) -> bytes:
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        parts = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(parts)

    def _serve(self) -> None:
        url = urlsplit(self.path)
        body = self._read_body()
        query = parse_qs(url.query)
        req = Request(self.command, unquote(url.path), url.path, query, self.headers, body)
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        fault = self.emu.faults.take(req.method, req.path, token or None)
        if fault and fault.delay_s:
            self.emu.hurried.wait(fault.delay_s)
        if fault and not fault.after_apply:
            if isinstance(fault.kind, int):
                return self._answer(req, *fault_response(fault, req.path))
            if fault.kind == DROP:
                return self._drop(req)
        try:
            status, headers, payload = self.emu.handle(req)
        except Exception as err:  # an emulator bug: answer it, and keep it for the test to see
            self.emu.errors.append(err)
            status, headers, payload = error_response(Reject(500, f"Emulator bug: {err!r}"))
        if fault and fault.after_apply:  # the request took effect; now lose the answer
            if isinstance(fault.kind, int):
                return self._answer(req, *fault_response(fault, req.path))
            return self._drop(req)
        truncate = fault is not None and fault.kind == TRUNCATE
        self._answer(req, status, headers, payload, truncate=truncate)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

    def _drop(self, req: Request) -> None:
        self.emu.record(req.method, req.path, 0)
        self.close_connection = True

    def _answer(self, req, status, headers, payload, truncate=False) -> None:
        # Recorded before the answer goes out: a client that has its answer may count at once.
        self.emu.record(req.method, req.path, status)
        self.send_response(status)
        # A cut answer promises more than it sends: at least a byte (an S3 PUT's body is empty)
        length = max(len(payload), 1) if truncate else len(payload)
        for key, value in {**headers, "Content-Length": str(length)}.items():
            self.send_header(key, value)
        self.end_headers()
        if req.method != "HEAD":
            self.wfile.write(payload[: len(payload) // 2] if truncate else payload)
        self.wfile.flush()
        self.close_connection = self.close_connection or truncate


class Server(ThreadingHTTPServer):
    daemon_threads = True
    emu = None

    def handle_error(self, request, client_address):  # quiet: e.g. a client hung up mid-answer
        self.emu.errors.append(sys.exc_info()[1])


class FaultyServer:
    """Serves `handle(Request)` on 127.0.0.1:<free port> from a thread, acting out `faults`."""

    def __init__(self, handle):
        self.handle = handle
        self.faults = FaultPlan()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status); 0 = dropped
        self.errors: list[BaseException] = []  # exceptions the server swallowed
        self.stopping = threading.Event()
        self.hurried = threading.Event()  # ends the waits of "slow" / "timeout" faults
        self._lock = threading.Lock()
        self._server = Server(("127.0.0.1", 0), type("BoundHandler", (Handler,), {"emu": self}))
        self._server.emu = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll makes close() quick (serve_forever checks for shutdown once per poll).
        poll = {"poll_interval": 0.02}
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs=poll, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        self.hurry()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def hurry(self) -> None:
        """Wake the handlers waiting in "slow" / "timeout" faults now (and skip later waits):
        a test whose client gave up on them need not wait for their answers to be logged."""
        self.hurried.set()

    def record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def stats(self) -> dict:
        """What this server saw, as JSON: its requests and the faults it acted out."""
        with self._lock:
            requests = [[m, p, s] for m, p, s in self.requests]
        injected = [[m, p, str(k)] for m, p, k in self.faults.injected]
        return {
            "requests": requests,
            "injected": injected,
            "errors": [repr(e) for e in self.errors],
        }

    def count(self, method: str | None = None, path_re: str | None = None) -> int:
        """How many requests matched `method` and `path_re` (a regex search)."""
        with self._lock:
            log = list(self.requests)
        hits = [p for m, p, _ in log if method is None or m == method]
        return sum(1 for p in hits if path_re is None or re.search(path_re, p))


def serve_cli(emulator_cls, argv: list[str] | None = None) -> int:
    """`python tests/hub_emulator.py ...`: write the URL to --port-file, serve until killed."""
    parser = argparse.ArgumentParser(description="Serve a local Hub emulator until killed.")
    parser.add_argument("--port-file", required=True, help="file to write the URL to")
    parser.add_argument("--token", action="append", default=[], help="TOKEN=USER (repeatable)")
    parser.add_argument("--readonly", action="append", default=[], help="a read-only TOKEN")
    parser.add_argument("--org", action="append", default=[], help="ORG=USER:ROLE,USER:ROLE")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="on the API origin")
    parser.add_argument("--storage-fault-rate", type=float, default=0.0, help="on the storage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-after", type=int, default=0, help="requests let through first")
    parser.add_argument("--commit-limit", type=int, default=0, help="commits per repo per window")
    parser.add_argument("--commit-window", type=float, default=3600.0, help="seconds (a window)")
    args = parser.parse_args(argv)
    emu = emulator_cls(dict(t.split("=", 1) for t in args.token) or None)
    for token in args.readonly:
        emu.readonly(token)
    for spec in args.org:
        org, _, members = spec.partition("=")
        emu.add_org(org, dict(m.split(":", 1) for m in members.split(",") if m))
    if args.commit_limit:  # the Hub's commit budget (tests/hub_emulator_budget.py)
        emu.limit_commits(args.commit_limit, args.commit_window)
    # Random faults include answers cut short, and commits that land with their answer lost
    plans = [(emu.faults, args.fault_rate, args.seed)]
    if hasattr(emu, "storage"):
        plans.append((emu.storage.faults, args.storage_fault_rate, args.seed + 1))
    for plan, rate, seed in plans:
        if rate:
            plan.random(
                rate, seed=seed, after=args.fault_after, statuses=LOST_ANSWERS, ambiguous=True
            )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    with emu:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(emu.url)
        tmp.replace(args.port_file)  # atomic: a reader never sees half a URL
        done.wait()
    return 0

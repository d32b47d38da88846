"""A fault-injecting HTTP proxy between an S3 client and a real S3 server (moto), for tests.

`FaultProxy` listens on 127.0.0.1:<free port> and forwards every request to the upstream
server unchanged (the client signs for the proxy's host; moto does not check signatures).
Before forwarding, a `FaultPlan` may decide to misbehave instead, as S3 and the network do:

- 500 / 503: answered at once with S3's XML error body (`InternalError`, `SlowDown`), the
  request never reaching the server;
- 403: `AccessDenied`, for the permanent-failure paths;
- "drop": the connection is closed without an answer, the server never sees the request;
- "lost": the request is forwarded and applied, then the connection is closed before the
  answer (a PUT that landed although its client cannot know);
- "stall": nothing is answered for `delay_s` (a server that accepts and hangs).

Faults are scripted (`add`) or drawn at a seeded random rate (`random`); every request and
every fault is recorded, so a test can count what its client spent and what it survived.
"""

from __future__ import annotations

import http.client
import random as _random
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

DROP, LOST, STALL = "drop", "lost", "stall"
RANDOM_KINDS = (500, 503, DROP, LOST)  # what a random plan draws (each equally likely)
ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
    403: ("AccessDenied", "Access Denied"),
}
CONDITIONS = {"if-match", "if-none-match"}
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class Fault:
    kind: int | str
    method: str | None = None
    path_re: re.Pattern | None = None
    times: int = 1
    delay_s: float = 0.0
    message: str | None = None  # an error's text instead of S3's usual one

    def matches(self, method: str, path: str) -> bool:
        if self.times <= 0 or (self.method and self.method != method):
            return False
        return self.path_re is None or self.path_re.search(path) is not None


class FaultPlan:
    """Scripted faults first, then a seeded random draw at ``rate``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripted: list[Fault] = []
        self._rng = _random.Random(0)
        self._rate = 0.0

    def add(self, kind, *, method=None, path_re=None, times=1, delay_s=0.0, message=None):
        """Misbehave on the next ``times`` requests matching ``method`` and ``path_re``."""
        path = re.compile(path_re) if path_re else None
        fault = Fault(kind, method, path, times, delay_s, message)
        with self._lock:
            self._scripted.append(fault)
        return fault

    def random(self, rate: float, seed: int = 0) -> None:
        with self._lock:
            self._rate, self._rng = rate, _random.Random(seed)

    def clear(self) -> None:
        with self._lock:
            self._scripted.clear()
            self._rate = 0.0

    def take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._scripted:
                if fault.matches(method, path):
                    fault.times -= 1
                    return fault
            if self._rate and self._rng.random() < self._rate:
                return Fault(self._rng.choice(RANDOM_KINDS))
        return None


def error_body(status: int, path: str, message: str | None = None) -> bytes:
    code, usual = ERRORS[status]
    message = message or usual
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><Resource>{path}</Resource>"
        f"<RequestId>proxy</RequestId></Error>"
    ).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 answers: clients reuse connections
    proxy: FaultProxy

    def log_message(self, format, *args):  # quiet: tests read proxy.requests instead
        pass

    def do_GET(self):  # noqa: N802 - the names http.server calls
        self._serve()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET  # noqa: N815

    def _serve(self) -> None:
        body = self._body()
        fault = self.proxy.plan.take(self.command, self.path)
        kind = fault.kind if fault else None
        self.proxy.record(self.command, self.path, kind)
        if kind in (DROP, STALL):
            if kind == STALL:
                self.proxy.stopping.wait(fault.delay_s)
            self.close_connection = True
            return
        if isinstance(kind, int):
            body = error_body(kind, self.path, fault.message)
            self._answer(kind, {"Content-Type": "application/xml"}, body)
            return
        status, headers, payload = self.proxy.forward(self.command, self.path, self.headers, body)
        if kind == LOST:  # applied upstream; the client never hears of it
            self.close_connection = True
            return
        self._answer(status, headers, payload)

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            chunks = []
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, headers: dict, payload: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in _HOP_BY_HOP | {"content-length", "transfer-encoding"}:
                self.send_header(name, value)
        length = headers.get("Content-Length") if self.command == "HEAD" else None
        no_body = self.command == "HEAD" or status in (204, 304)
        self.send_header("Content-Length", str(length or (0 if no_body else len(payload))))
        self.end_headers()
        if not no_body:
            self.wfile.write(payload)


class FaultProxy:
    """The proxy on a free local port, forwarding to ``upstream`` (e.g. moto's URL)."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.plan = FaultPlan()
        self.strip_conditions = False  # True: act as a store that ignores conditional writes
        self.requests: list[tuple[str, str, int | str | None]] = []  # (method, path, fault)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        handler = type("BoundHandler", (Handler,), {"proxy": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # a client hung up: fine
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        poll = {"poll_interval": 0.02}
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs=poll, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
            sent.pop("Transfer-Encoding", None)
            if self.strip_conditions and method == "PUT":
                sent = {k: v for k, v in sent.items() if k.lower() not in CONDITIONS}
            sent["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            payload = response.read()
            return response.status, dict(response.getheaders()), payload
        finally:
            conn.close()

    def reset(self) -> None:
        """No faults planned, none recorded: a clean proxy for the next test."""
        self.plan.clear()
        self.strip_conditions = False
        with self._lock:
            self.requests.clear()

    def record(self, method: str, path: str, fault) -> None:
        with self._lock:
            self.requests.append((method, path, fault))

    def faults(self) -> list[tuple[str, str, int | str]]:
        with self._lock:
            return [r for r in self.requests if r[2] is not None]

    def count(self, method: str | None = None, path_re: str | None = None) -> int:
        with self._lock:
            log = list(self.requests)
        return sum(
            1
            for m, p, _ in log
            if (method is None or m == method) and (path_re is None or re.search(path_re, p))
        )


def wait_for_port(url: str, timeout: float = 10.0) -> None:
    """Until something listens at ``url`` (a server started in another thread)."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    while True:
        try:
            http.client.HTTPConnection(parts.hostname, parts.port, timeout=1).connect()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)

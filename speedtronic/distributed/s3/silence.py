"""Whether the store answers at all: the gate in front of every request of one ``S3Client``.

A store that accepts connections and never answers costs each attempt its whole read timeout
(60 s), and a request retried 8 times costs 9 minutes: a worker sat that long before training
started (issue 27). So the client remembers silence. An attempt whose request got no answer
(it timed out with no HTTP response: botocore's ``after-call`` never fired) makes the store
*silent*; while it is, every request fails at once (an ``S3Error``, transient: the caller's
loop tries again later, I5) until a cool-down has passed, after which one request at a time
first sends a probe, a HEAD of the bucket that waits for as long as the cool-down was, and goes
on only if the store answered. The cool-down doubles from ``first_s`` up to the client's
read timeout, so a store that is slow rather than dead is heard again. Any HTTP answer, an
error too, ends the silence. Thread-safe: a node's threads share one client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from botocore import exceptions as bx

# A request sent, or a connection tried, that got no answer in time
NO_ANSWER = (bx.ReadTimeoutError, bx.ConnectTimeoutError)


class Silence:
    """The gate; ``probe(timeout_s)`` asks the store (True: it answered)."""

    def __init__(
        self,
        probe: Callable[[float], bool],
        *,
        first_s: float,
        longest_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._probe, self.first_s, self.longest_s, self.clock = probe, first_s, longest_s, clock
        self._lock = threading.Lock()
        self.heard_once = False  # the store answered this client at least once
        self.since: float | None = None  # silent since (None: it answers)
        self.cooldown = first_s
        self._next_try = 0.0
        self._probing = False
        self._attempt = threading.local()  # did this thread's attempt get an answer?

    def admit(self) -> str | None:
        """Before an attempt: None to go on, or why not (the store is silent)."""
        with self._lock:
            now = self.clock()
            if self.since is None:
                self._attempt.heard, self._attempt.started = False, now
                return None
            if self._probing or now < self._next_try:
                return self._why(now)
            self._probing, wait = True, self.cooldown
        heard = False
        try:
            heard = self._probe(wait)
        finally:
            with self._lock:
                self._probing = False
                if not heard:
                    self._silent(now)
        if not heard:
            with self._lock:
                return self._why(self.clock())
        self._attempt.heard, self._attempt.started = False, self.clock()
        return None

    def heard(self) -> None:
        """An HTTP answer came (botocore's ``after-call``, in the requesting thread)."""
        self._attempt.heard = True
        with self._lock:
            self.heard_once, self.since, self.cooldown = True, None, self.first_s

    def failed(self, exc: BaseException) -> None:
        """After an attempt raised ``exc``: no answer at all makes the store silent."""
        if isinstance(exc, NO_ANSWER) and not getattr(self._attempt, "heard", False):
            with self._lock:
                self._silent(getattr(self._attempt, "started", self.clock()))

    def _silent(self, asked_at: float) -> None:
        """No answer to what was asked at ``asked_at``: silent since then, or longer."""
        if self.since is None:
            self.since = asked_at
        else:
            self.cooldown = min(self.cooldown * 2, self.longest_s)
        self._next_try = self.clock() + self.cooldown

    def _why(self, now: float) -> str:  # the same words all along: callers throttle repeats
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - (now - (self.since or now))))
        return (
            f"the store has answered no request since {since} (it accepts none, or accepts "
            f"and answers none); asked again at most every {self.longest_s:g} s"
        )

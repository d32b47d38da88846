"""The Hub client's request policy: how often a call is tried, how long it waits between tries.

``RequestPolicy.run(op, fn)`` runs ``fn`` (one or more requests through huggingface_hub) inside
the session hooks (``session.attempt``: counted, timed out, no library retry loop), classifies
what it raises (``classify.Classifier``), and repeats the ``Transient`` failures up to
``max_attempts`` times: after the wait the server asked for (capped at ``max_backoff_s``, plus up
to a second of jitter so nodes do not return together), else after a full-jitter exponential
backoff. A call that runs out of attempts, or of time (``deadline_s`` for all its attempts and
waits), is one ``HubError`` line naming them; a permanent failure is raised at the first
attempt. Retries are logged at INFO.

Until the Hub has answered this client once (any HTTP response), a request waits at most
``FIRST_ANSWER_TIMEOUT_S`` and a call's attempts ``FIRST_ANSWER_DEADLINE_S`` in all: an
endpoint that accepts connections and never answers would otherwise hold a node's start-up
check for the whole policy (8 attempts of a 60 s timeout, plus backoff), with training not
started and nothing printed (I5); after one call has spent that deadline unanswered, each
call makes a single attempt until the Hub answers, so a node's start-up reads (the check, the
global, the listing) cost seconds, not a deadline each. Once it has answered, it is slow
rather than dead.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

from speedtronic.hub import session
from speedtronic.hub.budget import Budget
from speedtronic.hub.classify import Classifier
from speedtronic.hub.errors import HubError, Transient
from speedtronic.hub.wording import Op

T = TypeVar("T")
log = logging.getLogger("speedtronic.hub")

FIRST_ANSWER_TIMEOUT_S = 5.0
FIRST_ANSWER_DEADLINE_S = 12.0
DEADLINE_S = 300.0  # room for a few of the Hub's rate-limit waits (max_backoff_s each)


class RequestPolicy:
    """Retries, waits, timeouts and request counting for one client's calls; thread-safe."""

    def __init__(
        self,
        classifier: Classifier,
        budget: Budget,
        *,
        max_attempts: int = 8,
        max_backoff_s: float = 60.0,
        timeout_s: float = 60.0,
        deadline_s: float = DEADLINE_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.classifier, self.wording = classifier, classifier.wording
        self.api_origin = classifier.api_origin  # requests elsewhere are storage requests
        self.budget, self.timeout_s, self._sleep = budget, timeout_s, sleep
        self.max_attempts, self.max_backoff_s = max(1, max_attempts), max_backoff_s
        self.deadline_s, self._clock = deadline_s, clock
        self.answered = False  # has the Hub answered one of this client's requests yet?
        self.unanswered_call = False  # has a call given up before any answer came?
        self._backoff = tenacity.wait_random_exponential(multiplier=1, max=max_backoff_s)

    def request_timeout_s(self) -> float:
        """How long one request may wait for the Hub now."""
        return self.timeout_s if self.answered else min(self.timeout_s, FIRST_ANSWER_TIMEOUT_S)

    def heard(self) -> None:
        """An HTTP answer arrived (``session``'s response hook): the Hub is there."""
        self.answered = True

    def run(self, op: Op, fn: Callable[[], T]) -> T:
        """``fn()`` under the policy: transient failures retried, the rest raised at once."""
        began = self._clock()
        retrying = tenacity.Retrying(
            stop=lambda state: self._out_of_tries(state, began),
            wait=lambda state: min(self._wait(state), self._time_left(began)),
            retry=tenacity.retry_if_exception_type(Transient),
            sleep=self._sleep,
            before_sleep=lambda state: self._log_retry(op, state),
            reraise=True,
        )
        tries = [0]
        try:
            return retrying(self._counted_attempt, tries, op, fn)
        except Transient as exc:
            self.unanswered_call = self.unanswered_call or not self.answered
            message = self.wording.message(op, exc.status, exc.detail)
            message += f" (gave up after {tries[0]} attempt{'s' * (tries[0] != 1)}"
            if tries[0] < self.max_attempts:
                message += f" in {self._clock() - began:.0f} s"
            raise HubError(message + ")", status=exc.status, maybe_landed=exc.ambiguous) from None

    def _counted_attempt(self, tries: list[int], op: Op, fn: Callable[[], T]) -> T:
        tries[0] += 1
        return self.attempt(op, fn)

    def _deadline_s(self) -> float:
        if self.answered:
            return self.deadline_s
        return 0.0 if self.unanswered_call else min(self.deadline_s, FIRST_ANSWER_DEADLINE_S)

    def _time_left(self, began: float) -> float:
        return max(0.0, began + self._deadline_s() - self._clock())

    def _out_of_tries(self, state: tenacity.RetryCallState, began: float) -> bool:
        return state.attempt_number >= self.max_attempts or self._time_left(began) <= 0.0

    def attempt(self, op: Op, fn: Callable[[], T]) -> T:
        """One try of ``fn``, its requests hooked, its failure classified."""
        with session.attempt(self) as current:
            try:
                return fn()
            except Exception as exc:
                err = self.classifier.classify(exc, op, current)
                if err is exc:  # classified already, or no Hub failure: as it came
                    raise  # (``raise err from exc`` would make it its own cause)
                raise err from exc

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception()
        if isinstance(exc, Transient) and exc.wait_s is not None:
            # What the server asked for, plus a little jitter so nodes do not return together.
            return min(exc.wait_s, self.max_backoff_s) + random.uniform(0.0, 1.0)
        return self._backoff(state)

    def _log_retry(self, op: Op, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()  # a Transient: only those are retried
        msg, n = self.wording.message(op, exc.status, exc.detail), state.attempt_number
        log.info("%s (attempt %d of %d); retrying", msg, n, self.max_attempts)

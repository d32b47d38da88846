"""The Hub client's request policy: how often a call is tried, how long it waits between tries.

``RequestPolicy.run(op, fn)`` runs ``fn`` (one or more requests through huggingface_hub) inside
the session hooks (``session.attempt``: counted, timed out, no library retry loop), classifies
what it raises (``classify.Classifier``), and repeats the ``Transient`` failures up to
``max_attempts`` times: after the wait the server asked for (capped at ``max_backoff_s``, plus up
to a second of jitter so nodes do not return together), else after a full-jitter exponential
backoff. A call that runs out of attempts is one ``HubError`` line naming the attempts; a
permanent failure is raised at the first attempt. Retries are logged at INFO.
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
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.classifier, self.wording = classifier, classifier.wording
        self.api_origin = classifier.api_origin  # requests elsewhere are storage requests
        self.budget, self.timeout_s, self._sleep = budget, timeout_s, sleep
        self.max_attempts, self.max_backoff_s = max(1, max_attempts), max_backoff_s
        self._backoff = tenacity.wait_random_exponential(multiplier=1, max=max_backoff_s)

    def run(self, op: Op, fn: Callable[[], T]) -> T:
        """``fn()`` under the policy: transient failures retried, the rest raised at once."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(Transient),
            sleep=self._sleep,
            before_sleep=lambda state: self._log_retry(op, state),
            reraise=True,
        )
        try:
            return retrying(self.attempt, op, fn)
        except Transient as exc:
            message = self.wording.message(op, exc.status, exc.detail)
            message += f" (gave up after {self.max_attempts} attempts)"
            raise HubError(message, status=exc.status, maybe_landed=exc.ambiguous) from None

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

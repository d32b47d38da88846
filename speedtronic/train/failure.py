"""What a run keeps when a step fails: every step completed before it (issue 31).

An exception at step N (bad data, a non-finite streak, a model error, a full disk) used to
stop the run with nothing saved since the last interval checkpoint, while Ctrl-C saved. Now
``StepGuard`` marks the step counters and the data position as each step starts. When an
exception leaves the training loop after at least one completed step, the guard rolls the
counters and the data position back to the end of the last completed step (the failed step's
batches are read again on resume; its partial gradients never reached the weights) and calls
each plug-in's ``on_train_error(trainer, exc)``: the checkpoint plug-in saves and names the
checkpoint. The exception then goes on to the caller, which exits with its code.

The random streams are saved as the failure left them: a resumed run continues exactly from
the checkpoint, though no straight run could match it (none got past the failure). A DDP
group cannot save once one rank has failed (a save needs every rank), so there the guard lets
the error through untouched; so does a second Ctrl-C (``KeyboardInterrupt``), which aborts at
once. A plug-in failing here (the disk is still full) is reported and the original error goes
on.
"""

from __future__ import annotations

from typing import Any


class StepGuard:
    """``begin()`` before each step, ``end()`` once it completed; a context around the loop."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self._mark: tuple[int, int, int, Any] | None = None

    def begin(self) -> None:
        t = self.trainer
        state = t.data.state_dict() if hasattr(t.data, "state_dict") else None
        self._mark = (t.tokens, t.samples, t.skipped_steps, state)

    def end(self) -> None:
        self._mark = None

    def __enter__(self) -> StepGuard:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> bool:
        trainer = self.trainer
        if not isinstance(exc, Exception) or trainer.step == 0 or trainer.parallel is not None:
            return False
        self._roll_back()
        for plugin in trainer.plugins:
            handler = getattr(plugin, "on_train_error", None)
            if handler is None:
                continue
            try:
                handler(trainer, exc)
            except Exception as failure:  # the original error matters more: report, go on
                name = getattr(plugin, "name", type(plugin).__name__)
                reason = str(failure).strip().splitlines()[0] if str(failure).strip() else ""
                trainer.logger.warn(
                    f"{name}: could not keep the steps completed before the error "
                    f"({type(failure).__name__}: {reason})"
                )
        return False

    def _roll_back(self) -> None:
        """Counters and data position as the last completed step left them."""
        if self._mark is None:  # the step had completed; the error came after it
            return
        trainer = self.trainer
        trainer.tokens, trainer.samples, trainer.skipped_steps, state = self._mark
        trainer.optimizer.zero_grad(set_to_none=True)
        if state is not None:
            trainer.data.load_state_dict(state)
        self._mark = None

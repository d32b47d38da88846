"""A RUN opened for evaluation: its model on the chosen device and precision, as a Scorer.

The window is the model's context length (``config.seq_len`` of the reference model, else the
run's data block length): the longest sequence it was trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError
from speedtronic.evaluate.scorer import Scorer


def open_scorer(
    run_path: str | Path,
    tokenizer: str | None,
    device: str,
    batch_size: int,
    log: Callable[[str], None],
) -> tuple[Any, Scorer]:
    """(the RunModel, a Scorer over its model)."""
    from speedtronic.modelout.source import open_run
    from speedtronic.train.precision import emulation_warning, resolve_device, resolve_precision

    run = open_run(run_path, tokenizer, log=log)
    try:
        resolved = resolve_device(device)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("run.device", "--device", 1)) from None
    precision = resolve_precision(run.precision_mode, resolved, log)
    emulated = emulation_warning(resolved, precision.mode)
    if emulated:
        log(emulated)
    model = run.model.to(precision.device)
    window = getattr(getattr(model, "config", None), "seq_len", None) or run.context_len
    return run, Scorer(model, window, batch_size, precision.device, precision.autocast)

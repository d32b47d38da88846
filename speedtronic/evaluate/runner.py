"""A RUN opened for evaluation: its model on the chosen device and precision, as a Scorer.

The window (tokens each scored sequence holds) defaults to the run's training ``seq_len``, so
``eval`` reads the blocks training read; an imported model, never trained here, records none
and is read at its full context. A window longer than the model's context is refused: its
positions past the context were never trained (the reference model has no RoPE rows there).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError
from speedtronic.evaluate.scorer import Scorer

# Where the window came from, as eval reports it (json: window_from).
WINDOW_FROM = {
    "training": "the run's training seq_len",
    "model": "the model's context; an imported model records no training seq_len",
    "option": "--window",
}


def open_scorer(
    run_path: str | Path,
    tokenizer: str | None,
    device: str,
    batch_size: int,
    log: Callable[[str], None],
    window: int | None = None,
) -> tuple[Any, Scorer]:
    """(the RunModel, a Scorer over its model); ``window`` None: the run's default window
    (``choose_window`` says which)."""
    from speedtronic.modelout.source import open_run
    from speedtronic.train.precision import emulation_warning, resolve_device, resolve_precision

    run = open_run(run_path, tokenizer, log=log)
    window = choose_window(run, window)[0]  # refused before the model moves to a device
    try:
        resolved = resolve_device(device)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("run.device", "--device", 1)) from None
    precision = resolve_precision(run.precision_mode, resolved, log)
    emulated = emulation_warning(resolved, precision.mode)
    if emulated:
        log(emulated)
    model = run.model.to(precision.device)
    return run, Scorer(model, window, batch_size, precision.device, precision.autocast)


def choose_window(run: Any, requested: int | None) -> tuple[int, str]:
    """(the window, a WINDOW_FROM key): ``requested`` if given and within the model's context,
    else the training length, else (an imported model) the context."""
    context = model_context(run)
    if requested is not None:
        if requested > context:
            raise ConfigError(
                f"--window {requested}: must be <= the model's context of {context} tokens "
                "(the longest sequence it takes)"
            )
        return requested, "option"
    trained = training_len(run)
    return (context, "model") if trained is None else (min(trained, context), "training")


def model_context(run: Any) -> int:
    """The longest sequence the model takes: the reference model's ``seq_len`` (its RoPE
    tables), else the run's training length (nothing longer is known to work)."""
    return getattr(getattr(run.model, "config", None), "seq_len", None) or run.context_len


def training_len(run: Any) -> int | None:
    """The block length the run trained on (``data.seq_len``, else the model's ``seq_len``, as
    training picks it); None for an imported model, which no run here trained."""
    data = run.config.get("data")
    if isinstance(data, dict) and isinstance(data.get("seq_len"), int):
        return data["seq_len"]
    return None if "imported_from" in run.meta else run.context_len

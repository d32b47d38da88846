"""Which run a checkpoint directory holds, and whether a new run may start in it. Stdlib only.

A checkpoint directory holds one run: every checkpoint's meta.json carries the ``run_id`` of
the run that wrote it, a resumed run keeps its id, and ``latest.json`` points at the run's
newest checkpoint. A run started without ``--resume`` in a directory that already holds
checkpoints would save beside them and repoint ``latest.json`` at its own, mixing two runs
without a word (issue 21). ``check_fresh_start`` refuses that, naming the three ways on:
``--resume`` (continue that run), ``--output-dir`` (start this one elsewhere) and
``--overwrite`` (replace it). ``clear_checkpoints`` is the last: it deletes the old run's
checkpoints the way retention does, so a crash halfway never leaves a torn ``step_*`` dir or a
``latest.json`` that points at a deleted one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from speedtronic.checkpoint.layout import (
    LATEST_FILE,
    error_reason,
    list_step_dirs,
    parse_step,
    remove_checkpoint_dir,
)
from speedtronic.errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class HeldRun:
    """What a checkpoint directory holds: its ``step_*`` dirs (oldest first), any state."""

    root: Path
    dirs: list[Path]

    @property
    def steps(self) -> str:
        """``step 150`` or ``steps 20 to 150``: the span a person recognises a run by."""
        steps = [parse_step(d.name) for d in self.dirs]
        if not steps:
            return "a latest.json and no checkpoint"
        if len(steps) == 1:
            return f"a checkpoint at step {steps[0]}"
        return f"{len(steps)} checkpoints, steps {steps[0]} to {steps[-1]}"


def held_run(root: str | os.PathLike) -> HeldRun | None:
    """The run ``root`` holds, or None for a missing or empty directory.

    Any ``step_*`` dir counts, damaged ones too (they are that run's, and resume reports
    them); so does a lone ``latest.json``. Leftover ``.tmp-*`` dirs of a crashed save do not:
    no reader uses them and the next save removes them.
    """
    root = Path(root)
    if not root.is_dir():
        return None
    dirs = list_step_dirs(root)
    if not dirs and not (root / LATEST_FILE).exists():
        return None
    return HeldRun(root, dirs)


def check_fresh_start(held: HeldRun | None, key: str, where: Path) -> None:
    """Refuse a fresh run where ``held`` is another run; ``key`` and ``where`` name the place.

    ``key`` is the config key the user set the place with (``run.output_dir`` or
    ``checkpoint.directory``) and ``where`` its value, resolved.
    """
    if held is None:
        return
    inside = "" if held.root == where else f" in {held.root}"
    raise ConfigError(
        f"{key}: {where} already holds a run ({held.steps}{inside}); continue it with "
        "--resume, start a new run elsewhere with --output-dir DIR, or replace it with "
        "--overwrite",
        hint="in a config: checkpoint.resume: true, run.output_dir: DIR or checkpoint.overwrite:"
        " true. Nothing was changed",
    )


def clear_checkpoints(held: HeldRun) -> str:
    """Delete the run ``held`` describes (``--overwrite``); return a notice saying what went.

    ``latest.json`` goes first, so that no reader follows it into a dir being deleted; each
    ``step_*`` dir is then renamed to a ``.tmp-*`` name before its files are removed, as
    retention does. Nothing else in the directory is touched. An OSError becomes a
    CheckpointError naming the path.
    """
    latest = held.root / LATEST_FILE
    for path, remove in [(latest, _unlink), *((d, remove_checkpoint_dir) for d in held.dirs)]:
        try:
            remove(path)
        except OSError as exc:
            raise CheckpointError(
                f"--overwrite: could not delete {path}: {error_reason(exc)}"
            ) from exc
    return f"--overwrite: deleted the previous run in {held.root} ({held.steps})"


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)

"""``speedtronic import SRC OUT``: a pretrained transformers model as a Speedtronic run at step 0.

Export's mirror (``llama``'s one mapping table, read the other way): SRC is opened and checked
by ``source_model`` (an unsupported model is refused before anything is written), its tensors
read one at a time in their own dtype, and OUT becomes a run directory whose
``checkpoints/step_0000000000`` is an ordinary checkpoint: the weights, an empty trainer
state, and a meta.json whose config names the reference transformer with SRC's keys and the
tokenizer, so ``generate``, ``export``, ``ckpt inspect``, ``train --init-from OUT`` and a
DumbDiLoCo master (its first global) read it as they read a trained run. The tokenizer files
come along in ``OUT/tokenizer/`` and the checkpoint records ``tokenizer.json`` as a tokenized
dataset's manifest does. Everything is written in a ``.tmp-import-*`` sibling, checked there
(``--verify``) and renamed into place: OUT is new or empty (a link is the directory it points
at, as export's OUT), and an interrupted or refused import leaves it as it was. The sibling
holds a mark with its writer's pid and host until it is renamed; one whose writer is gone (a
``kill -9``) is removed by the next import into the same OUT, by ``data tokenize``'s rule.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtronic import liveness
from speedtronic.checkpoint.files import fsync_dir, install_dir
from speedtronic.checkpoint.layout import TMP_PREFIX, step_dir_name
from speedtronic.checkpoint.save import save_checkpoint
from speedtronic.checkpoint.tokenizer import tokenizer_record
from speedtronic.errors import ConfigError, OutputError
from speedtronic.modelout.card import json_bytes
from speedtronic.modelout.export import link_target
from speedtronic.modelout.source_model import SourceModel, load_state, open_source

IMPORT_MARK = "speedtronic_import.json"
WRITER_MARK = ".speedtronic-import-writer"  # in the temporary copy only: liveness.stamp()
TOKENIZER_DIR = "tokenizer"


@dataclass
class Imported:
    out: Path
    origin: str
    checkpoint: Path
    params: dict[str, Any]
    param_count: int
    tokenizer_files: list[str] = field(default_factory=list)
    verified: Any = None  # verify.Verified
    notes: list[str] = field(default_factory=list)


def import_model(
    src: str,
    out: str | Path,
    verify: Callable[[Path, SourceModel], Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> Imported:
    """Write SRC as a run directory in OUT (see the module docstring); ``verify(run_dir,
    source)`` checks the written run before it is moved into place (it raises to refuse it)."""
    given = Path(out)
    out = link_target(given)
    _check_out(out)
    source = open_source(src, log)
    tmp = out.parent / f"{_tmp_prefix(out)}{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(out)
        shutil.rmtree(tmp, ignore_errors=True)  # ours, from an earlier attempt
        tmp.mkdir()
        _write_file(tmp / WRITER_MARK, liveness.stamp().encode())
        done = _write(tmp, given, source)
        if verify is not None:
            done.verified = verify(tmp, source)
        (tmp / WRITER_MARK).unlink()
        install_dir(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise OutputError(f"OUT: could not write {out}: {exc.strerror or exc}") from exc
        raise
    done.checkpoint = given / "checkpoints" / step_dir_name(0)
    if source.tokenizer_path is None:
        done.notes.append(f"{src} has no tokenizer.json: generate and train need --tokenizer")
    return done


def _tmp_prefix(out: Path) -> str:
    return f"{TMP_PREFIX}import-{out.name}-"


def _remove_stale(out: Path) -> None:
    """Temporary copies of earlier imports into ``out`` whose writer is gone: marked as an
    import's and no longer held by their writer (``speedtronic.liveness``: a pid gone or taken
    by another process on this host, an empty or garbled mark). Anything else stays."""
    prefix = _tmp_prefix(out)
    for path in out.parent.iterdir() if out.parent.is_dir() else []:
        pid = path.name.removeprefix(prefix)
        if path.name.startswith(prefix) and pid.isdigit() and not path.is_symlink():
            mark = path / WRITER_MARK
            if mark.is_file() and not liveness.marker_alive(mark):
                shutil.rmtree(path, ignore_errors=True)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUT: {out} is a file; import writes a run directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(
            f"OUT: {out} is not empty; nothing was changed: import into a new or empty directory"
        )


def _write(tmp: Path, out: Path, source: SourceModel) -> Imported:
    """The run in ``tmp``: tokenizer files, the step-0 checkpoint, the mark (last)."""
    copied = _copy_tokenizer(source, tmp / TOKENIZER_DIR)
    record, data = tokenizer_record(source.tokenizer)
    state = load_state(source)
    count = sum(t.numel() for k, t in state.items() if k != "lm_head.weight" or not _tied(source))
    meta = {
        "run_id": "import-" + hashlib.sha256(source.origin.encode()).hexdigest()[:12],
        "tokens": 0,
        "samples": 0,
        "param_count": count,
        "config": stored_config(source, out),
        "tokenizer": record,
        "imported_from": {"source": source.origin, "config": source.hf_config},
    }
    extras = {"tokenizer.json": data} if data is not None else None
    save_checkpoint(tmp / "checkpoints", 0, state, {}, meta, extra_files=extras)
    del state
    files = {name: hashlib.sha256(body).hexdigest() for name, body in copied.items()}
    mark = {"written_by": "speedtronic import", "source": source.origin, "tokenizer": files}
    _write_file(tmp / IMPORT_MARK, json_bytes(mark))
    fsync_dir(tmp)
    return Imported(out, source.origin, tmp, source.params, count, sorted(copied))


def _tied(source: SourceModel) -> bool:
    return bool(source.params["tie_embeddings"])


def stored_config(source: SourceModel, out: Path | None) -> dict:
    """The config meta.json records: the reference transformer with SRC's keys. The tokenizer
    is the checkpoint's record (data.tokenizer names a file only for text to tokenize)."""
    from speedtronic.config import SpeedtronicConfig

    raw: dict[str, Any] = {"model": source.model_section()}
    if out is not None:
        raw["run"] = {"output_dir": str(out)}
    return SpeedtronicConfig.load(raw).to_dict(redact=True)


def _copy_tokenizer(source: SourceModel, folder: Path) -> dict[str, bytes]:
    """The tokenizer files as ``open_source`` read and checked them (read once, bounded)."""
    copied = source.tokenizer_data
    if copied:
        folder.mkdir()
    for name, data in copied.items():
        _write_file(folder / name, data)
    if copied:
        fsync_dir(folder)
    return copied


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

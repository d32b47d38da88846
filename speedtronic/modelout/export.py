"""``speedtronic export``: a run's checkpoint as a directory transformers loads.

``export_run`` writes ``config.json`` (LlamaForCausalLM, every field explicit),
``model.safetensors`` (``format: pt``, fp32 or bf16), ``generation_config.json``, the tokenizer
files, the ``README.md`` model card and ``speedtronic_export.json`` (provenance, and the mark
that says this directory is an export: the only kind of non-empty OUT it replaces; anything
else there is refused, nothing touched). Everything is written and fsynced in a ``.tmp-*``
sibling, checked with transformers there when asked (``--verify``), and only then renamed
into place: an interrupted or refused export leaves OUT as it was. A file of an earlier export
that was edited since (a hand-written README) is refused by name, never replaced; an OUT that is
a link is the directory it points at; a full disk is one line naming OUT (exit 1).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from speedtronic.checkpoint.files import fsync_dir, fsync_file, install_dir
from speedtronic.checkpoint.layout import (
    JSON_ERRORS,
    META_FILE,
    MODEL_FILE,
    TMP_PREFIX,
    sha256_file,
)
from speedtronic.errors import ConfigError, DataError, OutputError
from speedtronic.modelout import llama
from speedtronic.modelout.card import CardFacts, base_model, json_bytes, last_eval_loss, model_card
from speedtronic.modelout.source import RunModel
from speedtronic.modelout.stops import separator_bos, stop_tokens
from speedtronic.modelout.tokenizer_files import (
    special_tokens,
    specials_problem,
    token_ids,
    tokenizer_files,
)

EXPORT_MARK = "speedtronic_export.json"
EXPORT_FORMAT = 1
# What a run's generate defaults are, written into generation_config.json too.
DEFAULT_TEMPERATURE, DEFAULT_TOP_K = 0.8, 50


@dataclass
class Export:
    """An export written to ``out``: its files (name -> size), what ``--verify`` found, and
    notes for the user (e.g. a tokenizer with ids the model cannot embed)."""

    out: Path
    files: dict[str, int] = field(default_factory=dict)
    replaced: bool = False
    verified: Any = None  # verify.Verified
    notes: list[str] = field(default_factory=list)


def export_run(
    run: RunModel,
    out: str | Path,
    dtype: str = "fp32",
    repo_id: str | None = None,
    verify: Callable[[Path], Any] | None = None,
) -> Export:
    """Write ``run``'s model to ``out`` (see the module docstring); ``repo_id`` is named in the
    model card's loading example instead of the path; ``verify(folder)`` checks the finished
    files before they are moved into place (it raises to refuse them)."""
    if dtype not in llama.DTYPES:
        raise ConfigError(f"--dtype: must be one of {', '.join(llama.DTYPES)} (got {dtype!r})")
    config = llama.check_exportable(run.model, run.model_name)
    tokenizer = run.require_tokenizer()
    given = Path(out)
    out = link_target(given)
    replaced = check_out(out)
    files = _small_files(run, config, dtype, repo_id or str(given), tokenizer)
    tmp = out.parent / f"{TMP_PREFIX}export-{out.name}-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # ours, from an earlier attempt
        tmp.mkdir()
        written = _write(tmp, run, config, dtype, files)
        if verify is not None:
            verified = verify(tmp)
        install_dir(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        written_error = _write_error(exc, out)
        if written_error is None:
            raise
        raise written_error from exc
    done = Export(given, written, replaced, verified if verify is not None else None)
    tokens = getattr(tokenizer, "vocab_size", None)
    if tokens is not None and tokens > config.vocab_size:
        done.notes.append(
            f"the model's vocabulary ({config.vocab_size}) is smaller than its tokenizer's "
            f"({tokens}): text with a token id >= {config.vocab_size} cannot be fed to it "
            "(a run on synthetic data with a small vocabulary, say)"
        )
    return done


def link_target(out: Path) -> Path:
    """An OUT that is a link is the directory it points at: that is replaced, the link stays."""
    return Path(os.path.realpath(out)) if out.is_symlink() else out


def _write_error(exc: BaseException, out: Path) -> OutputError | None:
    """A full disk or a refused write as one line naming OUT (exit 1); safetensors reports its
    I/O errors as SafetensorError, not OSError."""
    from safetensors import SafetensorError

    if isinstance(exc, OSError):
        reason = exc.strerror or exc
    elif isinstance(exc, SafetensorError):
        reason = str(exc).splitlines()[0] if str(exc) else "SafetensorError"
    else:
        return None
    return OutputError(f"OUT: could not write {out} ({reason}); nothing there was changed")


def check_out(out: Path) -> bool:
    """True when ``out`` holds an earlier export (to be replaced), False when it is new or
    empty; a ConfigError (exit 2) for anything else."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUT: {out} is a file; export writes a directory")
    if not out.is_dir():
        return False
    entries = set(os.listdir(out))
    if not entries:
        return False
    mark = _read_mark(out)
    listed = set(mark.get("files", {})) | {EXPORT_MARK} if mark else set()
    if not mark or not entries <= listed:
        raise ConfigError(
            f"OUT: {out} is not empty and was not written by speedtronic export; nothing was "
            "changed: export to a new or empty directory"
        )
    for name in sorted(entries - {EXPORT_MARK}):
        if not _as_written(out / name, mark["files"][name]):
            raise ConfigError(
                f"OUT: {out / name} is not the file speedtronic export wrote there (it was "
                "edited or replaced since); nothing was changed: move it out of the way (or "
                "export to another directory) and run again"
            )
    return True


def _as_written(path: Path, record: Any) -> bool:
    """True when ``path`` still holds the bytes the export's mark records for it."""
    if not isinstance(record, dict) or path.is_symlink() or not path.is_file():
        return False
    return path.stat().st_size == record.get("bytes") and sha256_file(path) == record.get("sha256")


def _read_mark(out: Path) -> dict | None:
    try:
        mark = json.loads((out / EXPORT_MARK).read_text(encoding="utf-8"))
    except (OSError, *JSON_ERRORS):
        return None
    ok = isinstance(mark, dict) and isinstance(mark.get("files"), dict)
    return mark if ok and mark.get("written_by") == "speedtronic export" else None


def _small_files(run: RunModel, config, dtype: str, where: str, tokenizer: Any) -> dict:
    """Every file but the weights, as bytes, before anything is written."""
    facts = CardFacts(
        name=Path(where).name or where,
        where=where,
        config=config,
        params=run.model.num_parameters(),
        dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype],
        meta=run.meta,
        stored_config=run.config,
        tokenizer=tokenizer,
        eval_loss=last_eval_loss(run.checkpoint, run.meta),
        base_model=base_model(run.meta, run.config),
    )
    eos = sorted(stop_tokens(tokenizer, run.config))  # where speedtronic generate stops
    eos = [i for i in eos if i < config.vocab_size]
    bos = separator_bos(tokenizer)
    generation = llama.generation_config(config, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, eos, bos)
    hf_config = llama.llama_config(config, dtype, eos, bos)
    # what an import recorded of the source's files replaces what was found (issue 48)
    ids = {k: hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    _check_recorded(run, tokenizer, config.vocab_size)
    ids, generation_ids = token_ids(tokenizer, ids)
    specials = special_tokens(tokenizer, eos, bos)
    return {
        "config.json": json_bytes({**hf_config, **ids}),
        "generation_config.json": json_bytes({**generation, **generation_ids}),
        **tokenizer_files(tokenizer, config.seq_len, specials),
        "README.md": model_card(facts).encode("utf-8"),
    }


def _check_recorded(run: RunModel, tokenizer: Any, vocab: int) -> None:
    """The special tokens and ids the checkpoint records (an import's, before import checked
    them: issue 55 item 4) fit the model and its tokenizer, or nothing is written."""
    recorded = getattr(tokenizer, "specials", None)
    problem = specials_problem(recorded, tokenizer, vocab) if recorded else None
    if problem is not None:
        path, value, why = problem
        raise DataError(
            f"{run.checkpoint / META_FILE}: tokenizer.specials.{'.'.join(path)} {value!r} {why}; "
            "nothing written",
            hint="import the model again (import now refuses such files), or remove the key "
            "from meta.json's tokenizer.specials",
        )


def _write(tmp: Path, run: RunModel, config, dtype: str, files: dict[str, bytes]) -> dict:
    """The files in ``tmp``, each fsynced, the mark last; returns name -> size."""
    save_file(llama.llama_state(run.model, dtype), str(tmp / MODEL_FILE), metadata={"format": "pt"})
    # safetensors creates its file 0600 whatever the umask; every other file here (and every
    # checkpoint file) is created with the user's umask, so the weights get it too.
    os.chmod(tmp / MODEL_FILE, 0o666 & ~_umask())
    fsync_file(tmp / MODEL_FILE)
    records = {MODEL_FILE: _record_of(tmp / MODEL_FILE)}
    for name, data in files.items():
        records[name] = write_synced(tmp / name, data)
    source = run.meta.get("files", {}).get(MODEL_FILE, {}) if run.meta.get("files") else {}
    mark = {
        "written_by": "speedtronic export",
        "format": EXPORT_FORMAT,
        "dtype": dtype,
        "source": {
            "run_id": run.meta.get("run_id"),
            "step": run.meta.get("step"),
            "checkpoint": run.checkpoint.name,
            "weights_sha256": source.get("sha256"),
            "speedtronic": (run.meta.get("versions") or {}).get("speedtronic"),
        },
        "files": records,
    }
    return write_mark(tmp, mark)


def write_synced(path: Path, data: bytes) -> dict[str, Any]:
    """``data`` written to ``path`` and fsynced; its record for the mark (bytes, sha256)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_mark(tmp: Path, mark: dict[str, Any]) -> dict[str, int]:
    """The export mark written last (fsynced with its folder); returns the files' sizes."""
    write_synced(tmp / EXPORT_MARK, json_bytes(mark))
    fsync_dir(tmp)
    return {name: record["bytes"] for name, record in mark["files"].items()}


def _umask() -> int:
    """The process's umask; setting it is the only portable way to read it, so it is set back."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _record_of(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def export_files(out: Path) -> list[str]:
    """The files of the export in ``out`` (what a push uploads), the mark included."""
    mark = _read_mark(out)
    if mark is None:
        raise ConfigError(f"{out}: not a speedtronic export ({EXPORT_MARK} missing or unreadable)")
    return sorted(mark["files"]) + [EXPORT_MARK]

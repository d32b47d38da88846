"""``tokenize_corpus``: sources in, a token-shard folder (or one flat token file) out, resumably.

The one tokenize pipeline (``speedtronic data tokenize``). It takes OUT's lock and checks that
OUT is its own to write (``owner``: no source at or under it, a marked staging folder), then
resolves the request into a plan
(``plan``), or takes the plan of an unfinished run from ``OUT.partial/progress.json``; then it
walks the inputs in order: Hub files are downloaded a few ahead (``hub_source.Downloads``),
each file is cut into units (``formats``), the units go through one process per core with the
order kept (``pool``), and their tokens are appended to the shards (``writer``). The journal is
committed every couple of seconds and at each file's end; a kill loses at most the units since,
which a rerun of the same command reads again, giving byte-identical output. ``--max-tokens``
stops at the end of the document that reaches the cap (no further file is downloaded). At the
end the manifest is written last inside ``OUT.partial`` and the folder renamed to ``OUT``: a
folder named ``OUT`` is always complete (``manifest``). A flat ``.bin`` output is the one train
shard renamed into place, without a manifest.

Progress goes to ``on_progress(dict)`` after each unit (documents, tokens, input bytes done and
in total, files), notices (a download being waited for, an empty validation part) to
``on_notice(str)``; the command renders them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from speedtronic.data import manifest as manifests
from speedtronic.data.ingest import formats, owner, spec
from speedtronic.data.ingest import plan as plans
from speedtronic.data.ingest.encode import Encoded, held_out
from speedtronic.data.ingest.pool import make_pool, ordered
from speedtronic.data.ingest.spec import InputFile
from speedtronic.data.ingest.work import Setup, Task
from speedtronic.data.ingest.writer import JOURNAL, ShardWriter, write_json
from speedtronic.errors import DataError, OutputError, TrainingError

# At most this much work is read again after a kill (the environment variable: for tests)
COMMIT_S = float(os.environ.get("SPEEDTRONIC_TOKENIZE_COMMIT_S", "2.0"))


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def tokenize_corpus(
    request: plans.Request,
    out: str | Path,
    workers: int | None = None,
    cache_dir: str | Path | None = None,
    on_progress: Callable[[dict], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> dict:
    """Run (or finish) one tokenize; the report (counts, shards, where) as a dict."""
    plans.check_request(request)
    workers = check_workers(workers)
    out = owner.check_out(out)
    owner.check_sources(request.sources, out)
    with owner.OutLock(out):
        done = owner.already_done(out, request.record())
        if done is not None:
            return done
        partial = owner.open_staging(out)
        try:
            return _tokenize(request, out, partial, workers, cache_dir, on_progress, on_notice)
        except BaseException:
            _drop_if_empty(partial)
            raise


def check_workers(workers: int | None) -> int:
    """``--workers`` in 1 .. 4 x the cores here (more processes than that only wait)."""
    top = 4 * (os.cpu_count() or 1)
    if workers is not None and not 1 <= workers <= top:
        raise DataError(f"--workers: must be between 1 and {top} (got {workers})")
    return workers or default_workers()


def _drop_if_empty(partial: Path) -> None:
    """A failed start that wrote nothing leaves nothing behind (a part-downloaded file stays)."""
    journal = _read_journal(partial) if (partial / JOURNAL).is_file() else None
    downloads = partial / "downloads"
    started = journal is not None and journal.get("next") != [0, 0]
    if not started and not (downloads.is_dir() and any(downloads.rglob("*"))):
        shutil.rmtree(partial, ignore_errors=True)  # marked ours by owner.open_staging


def _tokenize(request, out, partial, workers, cache_dir, on_progress, on_notice) -> dict:
    journal = _read_journal(partial)
    if journal is not None and journal.get("next") == [0, 0]:
        journal = None  # nothing was written yet: start over, whatever it was started with
    if journal is not None:
        journal = _rewound(journal)
        next_file, next_unit = journal["next"]
        unread = next_file + (1 if next_unit else 0)
        plan = plans.resumed(journal["plan"], request, partial, unread)
        _check_tokenizer_copy(partial, plan)
    else:
        _clear(partial)
        plan = plans.resolve(request, partial, owner.avoid(out))
        for file in plan.inputs:
            if not file.on_hub:
                owner.check_input(file.name, os.path.realpath(file.path), out)
    run = _Run(plan, partial, out, journal, workers, cache_dir)
    run.on_progress, run.on_notice = on_progress or (lambda _: None), on_notice or (lambda _: None)
    return run.execute()


def _rewound(journal: dict) -> dict:
    """The journal, or, when the file it stopped inside changed since (a damaged file fixed, as
    docs/data.md says to do), the journal as it was when that file began: it is read again."""
    index, unit = journal["next"]
    start = journal.get("file_start")
    if not unit or start is None or index >= len(journal["plan"]["inputs"]):
        return journal
    before = InputFile.from_record(journal["plan"]["inputs"][index])
    try:
        now = None if before.on_hub else spec.local_inputs(before.path)[0]
    except DataError:
        return journal  # gone: plans.resumed names it
    if now is None or not spec.changed(before, now):
        return journal
    return {**journal, **start, "next": [index, 0], "current": _fresh_file()}


def _read_journal(partial: Path) -> dict | None:
    path = partial / JOURNAL
    if not path.is_file():
        return None
    try:
        import json

        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{path}: unreadable journal ({exc}); remove {partial} to start over"
        ) from None


def _clear(partial: Path) -> None:
    """A .partial folder without a journal holds nothing committed: start it empty (but for
    the marker that says it is ours)."""
    for child in partial.iterdir():
        if child.name != owner.MARKER:
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def _check_tokenizer_copy(partial: Path, plan: plans.Plan) -> None:
    if plan.tokenizer["kind"] == "byte":
        return
    copies = [(partial / plans.TOKENIZER_FILE, plan.tokenizer["sha256"])]
    if plan.chat:
        copies.append((partial / plan.chat["file"], plan.chat["template_sha256"]))
    for copy, digest in copies:
        if not copy.is_file() or plans.sha256_file(copy) != digest:
            raise DataError(
                f"{copy}: missing or changed since the tokenize started; remove {partial}"
            )


class _Run:
    """One execution of a plan: the loop over units, the commits, the final rename."""

    def __init__(self, plan, partial: Path, out: Path, journal, workers: int, cache_dir):
        self.plan, self.partial, self.out, self.workers = plan, partial, out, workers
        state = journal or {}
        self.next_file, self.next_unit = state.get("next", [0, 0])
        self.files: list[dict] = state.get("files", [])
        self.current: dict = state.get("current") or _fresh_file()
        self.max_id, self.capped = state.get("max_id", -1), state.get("capped", False)
        self.skipped = state.get("skipped", 0)
        self.chat: dict | None = state.get("chat") or (_fresh_chat() if plan.chat else None)
        self.file_start: dict | None = state.get("file_start")
        self.writer = ShardWriter(
            partial, plan.dtype, plan.request.shard_tokens, plan.request.flat, bool(plan.chat)
        )
        self.writer.resume(state.get("parts"))
        self.total_bytes = sum(f.size for f in plan.inputs)
        self.done_bytes = sum(f["input_bytes"] for f in self.files) + self.current["input_bytes"]
        keep = cache_dir is not None
        folder = Path(cache_dir) if keep else partial / "downloads"
        from speedtronic.data.ingest.hub_source import Downloads

        self.downloads = Downloads(list(plan.inputs), folder, keep)
        self._hashes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hash")
        self._last_commit = time.monotonic()
        self._digests: dict = {}  # file index -> its sha256, or the future computing it
        self.started = time.monotonic()

    def execute(self) -> dict:
        request = self.plan.request
        separator = self.plan.separator.record()
        chat = self.plan.chat and {
            **self.plan.chat,
            "path": str(self.partial / self.plan.chat["file"]),
        }
        setup = Setup(self._tokenizer_file(), separator, request.val_fraction, self.plan.dtype,
                      request.column, request.max_document_bytes, chat)  # fmt: skip
        pool = make_pool(setup, self.workers)
        finished = False
        try:
            self._commit()  # the plan is on disk before any token
            if not self.capped:
                for item, result in ordered(self._items(), pool, 2 * self.workers + 2):
                    if self._take(item, result):
                        break
            finished = True
        except BrokenProcessPool:
            self._commit()
            raise TrainingError(
                "a tokenize worker process died (out of memory, or killed?); what was "
                "committed is kept: run the same command again to continue (--workers 1 runs "
                "in this process)"
            ) from None
        except OutputError:
            raise  # a write failed: the last commit is the consistent state, kept as it is
        except BaseException:
            self._commit()  # what was written is kept: a rerun continues from here
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self.downloads.close(finished)
            self._hashes.shutdown(wait=False, cancel_futures=True)
        return self._finish()

    def _tokenizer_file(self) -> str | None:
        if self.plan.tokenizer["kind"] == "byte":
            return None
        return str(self.partial / plans.TOKENIZER_FILE)

    # -- the stream of work ------------------------------------------------------------------

    def _items(self) -> Iterator[object]:
        for index in range(self.next_file, len(self.plan.inputs)):
            file = self.plan.inputs[index]
            if file.on_hub:
                if not self.downloads.ready(index):
                    self.on_notice(f"downloading {file.name} ({file.size:,} bytes)")
                path, digest = self.downloads.local(index)
            else:
                path, digest = file.path, self._hashes.submit(plans.sha256_file, file.path)
            self._digests[index] = digest
            val = file.format == "text" and self._text_held_out(path)
            skip = self.next_unit if index == self.next_file else 0
            request = self.plan.request
            column = request.messages_key if request.chat else request.column
            for unit in formats.units(
                file.format, path, file.name, index, column, request.max_document_bytes,
                request.chat,
            ):  # fmt: skip
                if unit.index >= skip:
                    yield Task(unit, file.format, path, file.name, val)
            yield ("end", index, digest)

    def _text_held_out(self, path: str) -> bool:
        fraction = self.plan.request.val_fraction
        if fraction <= 0:
            return False
        bounds = formats.segment_bounds(Path(path))
        first = formats.read_range(path, 0, bounds[1], path) if len(bounds) > 1 else b""
        return held_out(formats.decode(first, 0, path), fraction)

    # -- results, in order -------------------------------------------------------------------

    def _take(self, item, result) -> bool:
        """Write one result (or close a file); True when the token cap is reached."""
        if not isinstance(item, Task):
            self._end_file(item[1], item[2])
            return False
        if isinstance(result, tuple):
            raise DataError(result[0], result[1])
        result = self._capped(result)
        self.writer.add("train", result.train, result.train_documents, result.text_bytes(False),
                        result.train_mask)  # fmt: skip
        self.writer.add("val", result.val, result.val_documents, result.text_bytes(True),
                        result.val_mask)  # fmt: skip
        self.writer.end_unit()
        for key, value in (result.chat or {}).items():
            if key in self.chat:  # not "sizes" nor "slot_conversations": per slot, for the cap
                self.chat[key] += value
        cur = self.current
        cur["documents"] += result.documents
        cur["tokens"] += int(result.train.size + result.val.size)
        cur["skipped"] += result.skipped
        cur["input_bytes"] += item.unit.input_bytes
        self.done_bytes += item.unit.input_bytes
        self.skipped += result.skipped
        self.max_id = max(self.max_id, result.max_id)
        self.next_file, self.next_unit = item.unit.file, item.unit.index + 1
        if self.capped:
            self._end_file(item.unit.file, self._digests.get(item.unit.file))
            return True
        if time.monotonic() - self._last_commit >= COMMIT_S:
            self._commit()
        self.on_progress(self.snapshot())
        return False

    def _capped(self, result: Encoded) -> Encoded:
        cap = self.plan.request.max_tokens
        if cap is None:
            return result
        room = cap - self.writer.parts["train"].tokens - self.writer.parts["val"].tokens
        if int(result.lengths.sum()) < room:
            return result
        self.capped = True
        return up_to(result, room)

    def _end_file(self, index: int, digest) -> None:
        file = self.plan.inputs[index]
        if digest is not None and not isinstance(digest, str):
            digest = digest.result()
        record = {**self.current, "name": file.name, "size_bytes": file.size}
        self.files.append({**record, "sha256": digest or file.sha256})
        self.current = _fresh_file()
        self.next_file, self.next_unit = index + 1, 0
        self._commit()
        self.downloads.release(index)

    def _commit(self) -> None:
        parts = self.writer.sync()
        if self.next_unit == 0:  # where the next file begins: a fixed file is read from here
            kept = {n: {**v, "closed": list(v["closed"])} for n, v in parts.items()}  # no alias
            self.file_start = {"parts": kept, "max_id": self.max_id, "skipped": self.skipped}
        state = {
            "file_start": self.file_start,
            "plan": self.plan.record(),
            "next": [self.next_file, self.next_unit],
            "parts": parts,
            "files": self.files,
            "current": self.current,
            "max_id": self.max_id,
            "capped": self.capped,
            "skipped": self.skipped,
            **({"chat": self.chat} if self.chat else {}),
        }
        write_json(self.partial / JOURNAL, state)
        self._last_commit = time.monotonic()

    def snapshot(self) -> dict:
        parts = self.writer.parts
        return {
            "documents": parts["train"].documents + parts["val"].documents,
            "tokens": parts["train"].tokens + parts["val"].tokens,
            "input_bytes": self.done_bytes,
            "total_input_bytes": self.total_bytes,
            "files_done": len(self.files),
            "files": len(self.plan.inputs),
            "elapsed_s": time.monotonic() - self.started,
        }

    # -- the end -------------------------------------------------------------------------------

    def _finish(self) -> dict:
        counts = self.snapshot()
        if counts["documents"] == 0 or counts["tokens"] == 0:
            names = ", ".join(f.name for f in self.plan.inputs[:3])
            shutil.rmtree(self.partial, ignore_errors=True)  # it holds nothing
            chat = self.chat or {}
            left = (
                f"; {chat['no_assistant']} conversation(s) without an assistant turn, "
                f"{chat['dropped']} whose first answer does not fit --seq-len"
                if chat
                else ""
            )
            raise DataError(
                f"the sources hold no documents ({len(self.plan.inputs)} file(s): {names}"
                f"{', ...' if len(self.plan.inputs) > 3 else ''}; {self.skipped} blank or "
                f"null rows skipped{left})"
            )
        parts = self.writer.finish()
        if self.plan.request.val_fraction and not parts["val"]:
            self.on_notice(
                f"the validation part is empty: no document of {counts['documents']} fell in "
                f"--val-fraction {self.plan.request.val_fraction}"
            )
        doc = manifests.build(self.plan.record(), parts, self.files, self._counts(counts))
        if self.plan.request.flat:
            os.replace(self.partial / parts["train"][0]["file"], self.out)
            owner.record_flat(self.out, doc)  # the same command again: "already done"
            shutil.rmtree(self.partial)
        else:
            write_json(self.partial / manifests.MANIFEST, doc)  # last: it says "complete"
            (self.partial / JOURNAL).unlink()
            os.replace(self.partial, self.out)
            (self.out / owner.MARKER).unlink(missing_ok=True)  # OUT is the manifest's now
        from speedtronic.data.ingest.hub_source import requests_made

        report = {**doc["counts"], "out": str(self.out), "already_done": False}
        return {**report, "shards": doc["parts"], **requests_made()}

    def _counts(self, counts: dict) -> dict:
        parts = self.writer.parts
        return {
            "tokens": counts["tokens"],
            "documents": counts["documents"],
            "train_tokens": parts["train"].tokens,
            "val_tokens": parts["val"].tokens,
            "train_documents": parts["train"].documents,
            "val_documents": parts["val"].documents,
            "skipped_rows": self.skipped,
            "files": len(self.files),
            "input_bytes": self.done_bytes,
            "max_id": self.max_id,
            "capped": self.capped,
            "dtype": self.plan.dtype,
            "vocab_size": self.plan.vocab_size,
            **({"chat": self.chat} if self.chat else {}),
        }


def up_to(result: Encoded, room: int) -> Encoded:
    """``result`` up to the end of the document that reaches ``room`` tokens."""
    ends = np.cumsum(result.lengths)
    keep = int(np.searchsorted(ends, room)) + 1
    flags, lengths = result.is_val[:keep], result.lengths[:keep]
    train_n, val_n = int(lengths[~flags].sum()), int(lengths[flags].sum())
    docs = (int((~flags).sum()), int(flags.sum()))  # documents, or a text file's segments
    if result.documents != len(result.lengths):  # text: the one document, if it started here
        docs = (result.train_documents, result.val_documents)
    kept = result.train[:train_n], result.val[:val_n]
    top = max((int(a.max()) for a in kept if a.size), default=-1)
    nbytes = None if result.nbytes is None else result.nbytes[:keep]  # the kept text's
    masks = [m if m is None else m[:n] for m, n in ((result.train_mask, train_n),
                                                      (result.val_mask, val_n))]  # fmt: skip
    chat = result.chat and {**result.chat,
                            "conversations": sum(result.chat["slot_conversations"][:keep]),
                            "trained_tokens": int(sum((m & 1).sum() for m in masks)),
                            "chat_tokens": sum(result.chat["sizes"][:keep])}  # fmt: skip
    return Encoded(*kept, lengths, flags, *docs, result.skipped, top, nbytes, *masks, chat)


def _fresh_chat() -> dict:
    from speedtronic.data.ingest.chat import COUNTS

    return dict.fromkeys(COUNTS, 0)


def _fresh_file() -> dict:
    return {"documents": 0, "tokens": 0, "skipped": 0, "input_bytes": 0}

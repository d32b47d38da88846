"""``data tokenize`` owns only what it wrote, and one OUT has one writer (issue 35).

Each case is one the issue measured on main: a user's ``corpus.partial/`` emptied and removed,
``data tokenize notes.bin notes.bin`` writing over its source, a flat output read back by its
own glob (48,940 -> 146,822 -> 342,586 bytes), two tokenize runs into one OUT, and OUT ``.``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from ingest_support import documents, expected_tokens, write_jsonl
from proc_support import quiet_env, wait
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.data.ingest import owner
from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request
from speedtronic.errors import DataError

runner = CliRunner()


def tokenize(*args: str):
    return runner.invoke(app, ["data", "tokenize", *args, "--workers", "1"])


def one_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("speedtronic:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_staging_folder_it_did_not_make_is_refused_and_left_as_it_was(tmp_path):
    source = write_jsonl(tmp_path / "a.jsonl", documents(20))
    mine = tmp_path / "corpus.partial"
    (mine / "keep").mkdir(parents=True)
    (mine / "thesis.tex").write_text("\\section{Five years of work}")
    (mine / "keep" / "data.csv").write_text("a,b\n1,2\n")
    before = snapshot(mine)
    result = tokenize(str(source), str(tmp_path / "corpus"))
    assert result.exit_code == 2
    line = one_error(result)
    assert str(mine) in line and "not made by speedtronic data tokenize" in line
    assert snapshot(mine) == before and not (tmp_path / "corpus").exists()


def test_its_own_staging_folder_is_marked_and_continued(tmp_path):
    docs = documents(40)
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    seen = []

    def stop(_):
        seen.append(1)
        if len(seen) == 1:
            raise KeyboardInterrupt

    request = Request((str(source),), shard_tokens=50)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, tmp_path / "out", workers=1, on_progress=stop)
    assert (tmp_path / "out.partial" / owner.MARKER).is_file()
    tokenize_corpus(request, tmp_path / "out", workers=1)
    assert not (tmp_path / "out" / owner.MARKER).exists()  # OUT holds what the manifest says


@pytest.mark.parametrize("how", ["same", "glob_dir", "inside", "link"])
def test_an_output_that_is_holds_or_lies_in_a_source_is_refused(tmp_path, how):
    notes = tmp_path / "notes.bin"
    notes.write_text("my notes, not tokens\n")
    sources, out = {
        "same": ([str(notes)], notes),
        "glob_dir": ([str(tmp_path)], tmp_path / "corpus"),  # a folder source holding OUT
        "inside": ([str(notes)], notes / "sub.bin"),
        "link": ([str(tmp_path / "link.bin")], notes),
    }[how]
    if how == "link":
        (tmp_path / "link.bin").symlink_to(notes)
    result = tokenize(*sources, str(out))
    assert result.exit_code == 2
    assert "name an OUT outside the sources" in one_error(result)
    assert notes.read_text() == "my notes, not tokens\n"


def test_a_glob_leaves_out_its_own_flat_output_which_is_then_already_done(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_text("abc " * 1000)
    out = src / "all.bin"
    sizes, verbs = [], []
    for _ in range(3):
        result = tokenize(str(src / "*"), str(out))
        assert result.exit_code == 0, result.output
        sizes.append(out.stat().st_size)
        verbs.append(result.stdout.split()[0])
    assert sizes == [sizes[0]] * 3 and sizes[0] == 2 * 3 * (4000 + 1)
    assert verbs == ["wrote", "already", "already"]
    out.write_bytes(out.read_bytes()[:-2])  # changed since: done again, whole
    assert tokenize(str(src / "*"), str(out)).exit_code == 0
    assert out.stat().st_size == sizes[0]


def test_a_second_tokenize_into_the_same_out_is_refused_while_the_first_runs(tmp_path):
    docs = documents(60)
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    running, release = threading.Event(), threading.Event()
    outcome: list = []

    def hold(_):
        running.set()
        release.wait(60)

    def first():
        request = Request((str(source),), shard_tokens=50)
        outcome.append(tokenize_corpus(request, tmp_path / "out", workers=1, on_progress=hold))

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert running.wait(60)
        other = write_jsonl(tmp_path / "b.jsonl", documents(5, seed=1))
        for sources in ([str(source)], [str(other)]):  # the same command, and another one
            second = tokenize(*sources, str(tmp_path / "out"))
            assert second.exit_code == 2
            line = one_error(second)
            assert "another data tokenize is writing it" in line and f"pid {os.getpid()}" in line
    finally:
        release.set()
        thread.join(60)
    assert outcome and outcome[0]["documents"] == 60
    assert not (tmp_path / ".out.lock").exists()
    tokens = expected_tokens(docs, None, 3)
    assert outcome[0]["tokens"] == len(tokens)


def test_a_lock_left_by_a_killed_tokenize_is_taken_over(tmp_path):
    """kill -9 leaves the lock file; the kernel dropped the lock with the process."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=quiet_env({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}),
    )
    assert holder.stdout.readline().strip() == "held"
    source = write_jsonl(tmp_path / "a.jsonl", documents(10))
    refused = tokenize(str(source), str(out))
    assert refused.exit_code == 2 and f"pid {holder.pid}" in one_error(refused)
    holder.send_signal(signal.SIGKILL)
    wait(holder)
    assert (tmp_path / ".out.lock").exists()  # what a kill -9 leaves behind
    assert tokenize(str(source), str(out)).exit_code == 0


HOLD = """
import sys, time
from pathlib import Path
from speedtronic.data.ingest.owner import OutLock
with OutLock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_without_flock_a_dead_holder_is_taken_over_and_a_live_one_refuses(tmp_path, monkeypatch):
    monkeypatch.setattr(owner, "_fcntl", lambda: None)
    out, lock = tmp_path / "out", tmp_path / ".out.lock"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    wait(gone)
    lock.write_text(f"{gone.pid} {socket.gethostname()}\n")
    with owner.OutLock(out):
        assert lock.read_text().split()[0] == str(os.getpid())
        with pytest.raises(DataError, match="another data tokenize is writing it"):
            owner.OutLock(out).__enter__()
    assert not lock.exists()


@pytest.mark.parametrize("out", [".", "/", "", "..", "a/.."])
def test_an_out_that_names_no_new_entry_is_one_line(tmp_path, out):
    source = write_jsonl(tmp_path / "a.jsonl", documents(5))
    result = tokenize(str(source), out)
    assert result.exit_code == 2
    assert f"OUT {out!r}: name a new folder" in one_error(result)


def test_the_same_command_twice_at_once_ends_whole(tmp_path):
    """The issue's run: one of two identical commands died in FileNotFoundError
    progress.json.tmp. Now each either writes OUT, finds it done, or is refused by the lock."""
    docs = documents(400)
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    command = [sys.executable, "-m", "speedtronic", "data", "tokenize", str(source),
               str(tmp_path / "out"), "--workers", "1", "--shard-tokens", "500"]  # fmt: skip
    env = quiet_env({"SPEEDTRONIC_TOKENIZE_COMMIT_S": "0"})
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(2)
    ]
    results = [(wait(p), p.stderr.read().decode()) for p in procs]
    for code, err in results:
        assert code == 0 or (code == 2 and "another data tokenize is writing it" in err), err
    assert any(code == 0 for code, _ in results)
    again = tokenize(str(source), str(tmp_path / "out"), "--shard-tokens", "500")
    assert again.exit_code == 0 and "already complete" in again.stdout
    from speedtronic.data.manifest import read_manifest

    assert read_manifest(tmp_path / "out", "out")["counts"]["documents"] == 400


def test_an_unfinished_run_of_an_older_version_is_adopted_and_a_stray_file_refuses(tmp_path):
    source = write_jsonl(tmp_path / "a.jsonl", documents(30))
    request = Request((str(source),), shard_tokens=50)
    seen = []

    def stop(_):
        seen.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, tmp_path / "out", workers=1, on_progress=stop)
    partial = tmp_path / "out.partial"
    (partial / owner.MARKER).unlink()  # as a tokenize before the marker left it
    (partial / "notes.txt").write_text("mine")
    refused = tokenize(str(source), str(tmp_path / "out"))
    assert refused.exit_code == 2 and "not made by speedtronic data tokenize" in refused.stderr
    (partial / "notes.txt").unlink()
    adopted = tokenize(str(source), str(tmp_path / "out"), "--shard-tokens", "50")
    assert adopted.exit_code == 0, adopted.stderr

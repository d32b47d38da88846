"""A tokenize killed with SIGKILL resumes to byte-identical output (issue 28, slow tier).

The real command runs in its own process with two worker processes; it is killed as soon as its
journal shows committed progress, then again on the rerun (inside a file), then one worker of the
third run is killed (exit 1, one line), and the fourth run finishes. Every file of the result
equals a run that was never interrupted, the manifest included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ingest_support import documents, train_bpe, write_jsonl, write_parquet

from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request

pytestmark = pytest.mark.slow
pytest.importorskip("pyarrow")
ROOT = Path(__file__).resolve().parents[2]


def start(args: list[str]) -> subprocess.Popen:
    # commits every 0.2 s, not 2 s: the kill inside a file must find one there
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPEEDTRONIC_TOKENIZE_COMMIT_S": "0.2"}
    cmd = [sys.executable, "-m", "speedtronic", "data", "tokenize", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def progress(journal: Path) -> list[int] | None:
    try:
        return json.loads(journal.read_text())["next"]
    except (OSError, ValueError, KeyError):
        return None


def kill_once_past(proc, journal: Path, after: list[int], mid_file: bool = False) -> list[int]:
    """SIGKILL ``proc`` once its journal's position is past ``after`` (and inside a file if
    ``mid_file``); that position. Its worker processes must end with it."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = progress(journal)
        if seen is not None and seen > after and (seen[1] > 0 or not mid_file):
            workers = children(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            assert len(workers) >= 2 and all_gone(workers), "worker processes outlived their parent"
            return seen
        if proc.poll() is not None:
            pytest.fail(f"the tokenize ended before it could be killed: {proc.stderr.read()!r}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail("no progress within 120 s")


def children(parent: int) -> list[int]:
    """The worker processes of ``parent`` (Linux /proc): its children that multiprocessing
    spawned to run tasks (not its resource tracker)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            mine = f"\nPPid:\t{parent}\n" in status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if mine and b"spawn_main" in cmdline:
            found.append(int(status.parent.name))
    return found


def all_gone(pids: list[int], wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_killed_tokenize_resumes_to_identical_bytes(tmp_path):
    bpe = train_bpe(tmp_path / "tokenizer.json", vocab_size=800)
    src = tmp_path / "src"
    src.mkdir()
    docs = documents(9000, seed=5)
    for i in range(3):
        write_parquet(src / f"{i:03d}_00000.parquet", docs[i * 1000 : (i + 1) * 1000], 100)
    write_parquet(src / "003_00000.parquet", docs[3000:7200], 50)  # long: killed inside it
    write_jsonl(src / "zz_tail.jsonl.gz", docs[7200:])
    args = ["--tokenizer", str(bpe), "--val-fraction", "0.05", "--shard-tokens", "40000"]
    reference = Request((str(src),), str(bpe), val_fraction=0.05, shard_tokens=40_000)
    tokenize_corpus(reference, tmp_path / "straight", workers=1)

    out, journal = tmp_path / "cut", tmp_path / "cut.partial" / "progress.json"
    first = kill_once_past(start([str(src), str(out), *args, "--workers", "2"]), journal, [0, 0])
    assert not out.exists() and (tmp_path / "cut.partial").is_dir()
    again = start([str(src), str(out), *args, "--workers", "2"])
    second = kill_once_past(again, journal, first, mid_file=True)
    assert second > first and second[1] > 0, (first, second)
    third = start([str(src), str(out), *args, "--workers", "2"])
    while progress(journal) == second and third.poll() is None:
        time.sleep(0.01)
    victims = children(third.pid)
    assert victims and third.poll() is None, "the third run ended before a worker could be killed"
    os.kill(victims[0], signal.SIGKILL)  # a worker dies (the OOM killer's way): one line, exit 1
    _, err = third.communicate(timeout=120)
    assert third.returncode == 1, err.decode()
    assert "a tokenize worker process died" in err.decode()
    finish = start([str(src), str(out), *args, "--workers", "2", "--format", "json"])
    stdout, stderr = finish.communicate(timeout=300)
    assert finish.returncode == 0, stderr.decode()
    assert json.loads(stdout)["documents"] == 9000

    names = sorted(p.name for p in (tmp_path / "straight").iterdir())
    assert names == sorted(p.name for p in out.iterdir()) and len(names) > 5
    for name in names:
        assert (out / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name
    assert not (tmp_path / "cut.partial").exists()

"""scripts/hub_emulator.py (issue 40): the Hub emulator as a process a user starts to try
``hf://`` sources and ``--push`` offline; the lines it prints are all that is needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import proc_support
from ingest_support import documents, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_the_printed_lines_let_data_tokenize_read_a_seeded_dataset(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    write_jsonl(notes / "a.jsonl", documents(40))
    env_file = tmp_path / "hub.env"
    script = [sys.executable, str(ROOT / "scripts" / "hub_emulator.py")]
    args = ["--dataset", f"your-name/notes={notes}", "--env-file", str(env_file)]
    emu = subprocess.Popen(
        [*script, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        proc_support.wait_for(env_file.exists, emu)
        lines = env_file.read_text().splitlines()
        assert [line.split("=")[0] for line in lines] == ["export HF_ENDPOINT", "export HF_TOKEN"]
        assert lines[0].startswith("export HF_ENDPOINT=http://127.0.0.1:")
        assert env_file.stat().st_mode & 0o077 == 0  # the token file is the user's alone
        hub = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        env = proc_support.quiet_env({**hub, "PYTHONPATH": str(ROOT)})
        out = tmp_path / "corpus"
        command = [sys.executable, "-m", "speedtronic", "data", "tokenize"]
        command += ["hf://datasets/your-name/notes", str(out), "--format", "json"]
        result = proc_support.run(command, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["documents"] == 40
    finally:
        emu.send_signal(signal.SIGTERM)
        stdout, _ = proc_support.communicate(emu)
    assert emu.returncode == 0 and stdout.splitlines() == lines  # what it printed, exactly


def test_a_bad_dataset_argument_is_one_line(tmp_path):
    script = str(ROOT / "scripts" / "hub_emulator.py")
    result = proc_support.run([sys.executable, script, "--dataset", "nope"], env=dict(os.environ))
    assert result.returncode != 0
    assert result.stderr.strip() == "hub_emulator: error: --dataset 'nope': expected OWNER/NAME=DIR"

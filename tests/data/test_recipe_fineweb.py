"""docs/fineweb.md's commands, as written, end to end against the Hub emulator (slow tier).

The emulator serves the recipe's layout: a ``HuggingFaceFW/fineweb-edu`` dataset repo whose
``sample/10BT/000_00000.parquet`` and ``001_00000.parquet`` hold FineWeb-Edu's ten columns
(``text`` among them), beside ``sample/100BT/`` and ``data/`` shards the glob must skip, and an
``openai-community/gpt2`` model repo whose ``tokenizer.json`` is a BPE trained here (GPT-2's
cannot be downloaded offline; same kind of file, 1,000 ids). The page's commands run in a fresh
folder with ``configs/`` beside them; the train command gets ``--set`` overrides that shrink the
model and the steps to seconds on a CPU, everything else (data paths, evaluation on the held-out
part, the vocabulary) as ``configs/gpt2_small_fineweb.yaml`` says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ingest_support import documents, parquet_bytes, train_bpe

pytestmark = [pytest.mark.slow, pytest.mark.hub]
pytest.importorskip("pyarrow")
ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "fineweb.md"
SHRINK = [
    "--set", "model.n_layer=1", "--set", "model.n_head=2", "--set", "model.d_model=64",
    "--set", "model.seq_len=64", "--set", "data.micro_batch_size=4",
    "--set", "data.target_batch_size=8", "--set", "data.num_workers=0",
    "--set", "data.eval_every=3", "--set", "data.eval_batches=2", "--set", "run.max_steps=6",
    "--set", "optimizer.lr=3e-3",
    "--set", "scheduler.warmup_steps=1", "--set", "precision.mode=fp32",
    "--set", "compile=false", "--set", "run.device=cpu", "--set", "checkpoint.interval=0",
    "--log-format", "json",
]  # fmt: skip


def recipe_commands() -> list[list[str]]:
    """The ``speedtronic`` commands of the page's recipe block, continuation lines joined."""
    text = PAGE.read_text(encoding="utf-8")
    block = re.search(r"<!-- recipe:[^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert block, "docs/fineweb.md has no recipe block"
    joined = block.group(1).replace("\\\n", " ")
    lines = [line.split("#")[0].strip() for line in joined.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("speedtronic ")]


def run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "speedtronic", *args[1:]]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_recipe_runs_as_written(hub_emulator, tmp_path):
    tokenize, train = recipe_commands()
    assert tokenize[:3] == ["speedtronic", "data", "tokenize"]
    assert train[:2] == ["speedtronic", "train"]
    docs = documents(6000, seed=11)
    hub_emulator.create_repo(
        "datasets/HuggingFaceFW/fineweb-edu",
        files={
            "sample/10BT/000_00000.parquet": parquet_bytes(docs[:3000], row_group_size=500),
            "sample/10BT/001_00000.parquet": parquet_bytes(docs[3000:], row_group_size=500),
            "sample/100BT/000_00000.parquet": parquet_bytes(docs[:10]),
            "data/CC-MAIN-2024-10/train-00000-of-00001.parquet": parquet_bytes(docs[:10]),
            "README.md": b"---\nlicense: odc-by\n---\n# FineWeb-Edu (emulated)\n",
        },
    )
    bpe = train_bpe(tmp_path / "bpe.json", vocab_size=1000)
    hub_emulator.create_repo(
        "openai-community/gpt2",
        files={"tokenizer.json": bpe.read_bytes(), "config.json": b'{"model_type": "gpt2"}'},
    )
    work = tmp_path / "clone"
    work.mkdir()
    shutil.copytree(ROOT / "configs", work / "configs")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": hub_emulator.url}
    env.pop("HF_TOKEN", None)

    made = run([*tokenize, "--format", "json"], work, env)
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    assert report["files"] == 2 and report["documents"] == 6000
    assert report["val_documents"] > 0 and report["vocab_size"] == 1000
    out = work / "data" / "fineweb-edu-10BT"
    manifest = json.loads((out / "manifest.json").read_text())
    sha = hub_emulator.repo("openai-community/gpt2").head.sha
    assert manifest["tokenizer"]["source"] == f"hf://openai-community/gpt2@{sha}/tokenizer.json"
    assert all("/sample/10BT/" in s["name"] for s in manifest["sources"])
    assert manifest["separator"]["tokens"] == ["<|endoftext|>"]

    trained = run([*train, *SHRINK], work, env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    events = [json.loads(line) for line in trained.stdout.splitlines() if line.startswith("{")]
    evals = [e for e in events if e.get("event") == "eval"]
    assert len(evals) == 2 and evals[1]["eval_loss"] < evals[0]["eval_loss"] < 11.0  # learning
    again = run(tokenize, work, env)  # pasted twice: the second says so and does nothing
    assert again.returncode == 0 and "already complete" in again.stdout

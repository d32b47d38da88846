"""Shared fixtures: tiny configs that train in well under a second on a CPU."""

from __future__ import annotations

import copy
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TINY: dict[str, Any] = {
    "run": {"name": "tiny", "seed": 0, "device": "cpu", "max_steps": 6},
    "model": {
        "name": "reference_transformer",
        "vocab_size": 64,
        "seq_len": 16,
        "n_layer": 1,
        "n_head": 2,
        "d_model": 32,
    },
    "data": {"micro_batch_size": 4, "target_batch_size": 8},
    "optimizer": {"lr": 1e-2},
    "scheduler": {"warmup_steps": 2},
    "logging": {"every_steps": 2},
}


@pytest.fixture(autouse=True)
def machine_cache(tmp_path, monkeypatch) -> Path:
    """Each test decides the CPU's bf16/fp16 verdict afresh, in its own cache folder (inherited
    by the processes it starts): never the user's, and never one an injected probe left."""
    folder = tmp_path / "machine-cache"
    monkeypatch.setenv("SPEEDTRONIC_MACHINE_CACHE", str(folder))
    emulation = sys.modules.get("speedtronic.train.emulation")
    if emulation is not None:
        monkeypatch.setattr(emulation, "_VERDICTS", {})
    return folder


@pytest.fixture
def tiny(tmp_path) -> dict[str, Any]:
    """A fresh tiny config dict writing into a temporary output directory."""
    config = copy.deepcopy(TINY)
    config["run"]["output_dir"] = str(tmp_path / "run")
    return config


def pytest_collection_modifyitems(config, items):
    """Skip the ``gpu`` tier cleanly where CUDA is missing; torch is imported only if needed."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu tier: needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """A folder with a ``speedtronic`` to put on PATH: it runs this checkout with this
    interpreter (for shell completion scripts and documented console commands)."""
    root = Path(__file__).resolve().parents[1]
    folder = tmp_path_factory.mktemp("bin")
    script = folder / "speedtronic"
    script.write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}} "
        f'exec {shlex.quote(sys.executable)} -m speedtronic "$@"\n'
    )
    script.chmod(0o755)
    return folder


@pytest.fixture
def hub_emulator():
    """A local Hugging Face Hub answering as the Hub does (tests/hub_emulator.py), for any test
    file: ``.url`` (the endpoint: ``HF_ENDPOINT``, ``HfApi(endpoint=...)``,
    ``HubClient(endpoint=...)``), ``.token`` (a write token of user ``alice``), ``.storage.url``
    (the second origin LFS files live on), ``.create_repo`` / ``.push`` / ``.repo`` (straight
    to its state, no HTTP), ``.faults`` and ``.storage.faults`` (failures on either origin),
    ``.requests`` and ``.storage.requests`` (what each saw). Closed after the test."""
    from hub_emulator import HubEmulator

    with HubEmulator({"hf_test_writer": "alice"}) as emu:
        emu.token = "hf_test_writer"
        yield emu


@pytest.fixture
def library_sleeps(monkeypatch) -> list[float]:
    """Sleeps anything else takes through time.sleep (huggingface_hub's own retry loops): for
    the Hub client's tests, where the client's policy is the only one that should ever wait."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield slept
    assert slept == [], "huggingface_hub slept in its own retry loop"

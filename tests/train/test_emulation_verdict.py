"""Issue 40, item 5: one bf16 verdict per machine, the same in every command and process.

``bench`` said native bf16 while a ``generate`` at load 12 warned "bf16 is emulated ... 5x
slower" and a later one did not: each command timed a 64x64 matmul of its own. Now the CPU's
flags decide where they can, a load-robust timing where they cannot, and the verdict is cached
on disk per machine. Nothing here assumes a CPU feature: /proc/cpuinfo is a file the test
writes, and every timing is injected (or, where real, only its type is checked).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

import pytest
import torch

from speedtronic.bench import plan
from speedtronic.cli import machine_facts
from speedtronic.cli.options import load_config
from speedtronic.optim.muon import ns_precision
from speedtronic.train import emulation
from speedtronic.train.precision import emulation_warning

CPU = torch.device("cpu")
X86 = "fpu vme sse sse2 avx avx2 fma"  # a flags line without any bf16 unit


def fake_cpu(monkeypatch, tmp_path, flags: str | None, name: str = "Test CPU 9000") -> None:
    """Point the verdict at a cpuinfo the test wrote (``None``: a machine without one)."""
    path = tmp_path / "cpuinfo"
    if flags is not None:
        path.write_text(f"processor\t: 0\nmodel name\t: {name}\nflags\t\t: {flags}\n")
    monkeypatch.setattr(emulation, "CPUINFO", path)
    for var in emulation.ISA_CAPS:
        monkeypatch.delenv(var, raising=False)


def noisy_probe(monkeypatch, readings=(5.0, 1.0)) -> list[float]:
    """A timing that flips between an "emulated" and a native reading on every call."""
    taken: list[float] = []
    flips = itertools.cycle(readings)

    def timed(mode: str, *args) -> float:
        taken.append(next(flips))
        return taken[-1] * emulation.TIMING_FACTOR / 4

    monkeypatch.setattr(emulation, "timed_slowdown", timed)
    return taken


def new_process(monkeypatch) -> None:
    """What a new process starts with: no verdict in memory, only what is on disk."""
    monkeypatch.setattr(emulation, "_VERDICTS", {})


@pytest.mark.parametrize(
    ("flags", "emulated"),
    [(X86 + " avx512f avx512_bf16", False), (X86 + " amx_tile amx_bf16", False), (X86, True)],
)
def test_the_flags_decide_and_a_noisy_probe_is_never_asked(monkeypatch, tmp_path, flags, emulated):
    fake_cpu(monkeypatch, tmp_path, flags)
    taken = noisy_probe(monkeypatch)
    for _ in range(4):
        new_process(monkeypatch)
        found = emulation.verdict("bf16")
        assert (found.emulated, found.basis) == (emulated, "cpu flags")
    assert taken == []


def test_without_flags_a_noisy_probe_is_asked_once_and_its_verdict_kept(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, tmp_path, None)
    taken = noisy_probe(monkeypatch)
    verdicts = set()
    for _ in range(6):  # six commands, each a new process reading the same cache
        new_process(monkeypatch)
        verdicts.add(emulation.verdict("bf16").emulated)
    assert verdicts == {True} and len(taken) == 1


def test_a_capped_math_library_is_timed_even_with_the_flags(monkeypatch, tmp_path):
    # ONEDNN_MAX_CPU_ISA=AVX2 makes bf16 emulated on an AVX512-BF16 CPU: the flags would lie.
    fake_cpu(monkeypatch, tmp_path, X86 + " avx512_bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    taken = noisy_probe(monkeypatch, readings=(20.0,))
    found = emulation.verdict("bf16")
    assert (found.emulated, found.basis, taken) == (True, "timing", [20.0])
    assert found.slowdown == 20.0 * emulation.TIMING_FACTOR / 4


def test_the_key_names_the_cpu_and_the_torch_build(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, tmp_path, X86)
    key = emulation.machine_key("bf16")
    assert emulation.machine_key("bf16") == key
    assert emulation.machine_key("fp16") != key
    monkeypatch.setattr(torch, "__version__", "0.0.1+other")
    assert emulation.machine_key("bf16") != key
    monkeypatch.undo()
    fake_cpu(monkeypatch, tmp_path, X86 + " avx512_bf16")
    assert emulation.machine_key("bf16") != key
    fake_cpu(monkeypatch, tmp_path, X86, name="Another CPU")
    assert emulation.machine_key("bf16") != key


def test_the_cache_is_one_file_per_machine_and_deleting_it_reprobes(
    monkeypatch, tmp_path, machine_cache
):
    fake_cpu(monkeypatch, tmp_path, None)
    taken = noisy_probe(monkeypatch)
    first = emulation.verdict("bf16")
    path = emulation.cache_path("bf16")
    assert first.cache == str(path) and path.parent == machine_cache
    assert json.loads(path.read_text())["emulated"] is True
    path.unlink()  # the documented re-probe
    new_process(monkeypatch)
    assert emulation.verdict("bf16").emulated is False and len(taken) == 2


def test_a_damaged_cache_file_is_decided_again(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, tmp_path, X86)
    path = emulation.cache_path("bf16")
    path.parent.mkdir(parents=True)
    path.write_text('{"mode": "bf16", "emul')
    assert emulation.verdict("bf16").emulated is True
    assert json.loads(path.read_text())["basis"] == "cpu flags"


def test_two_processes_deciding_at_once_keep_the_first_verdict(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, tmp_path, None)
    path = emulation.cache_path("bf16")
    path.parent.mkdir(parents=True)
    first = emulation._write(path, emulation.Verdict("bf16", True, "timing", 9.0, 128))
    second = emulation._write(path, emulation.Verdict("bf16", False, "timing", 1.0, 128))
    assert first.emulated is True and second.emulated is True
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


SUBPROCESS = """
import json, sys
from pathlib import Path
from speedtronic.train import emulation
emulation.CPUINFO = Path(sys.argv[1])
emulation.timed_slowdown = lambda mode, *a: float(sys.argv[2])
found = emulation.verdict("bf16")
print(json.dumps([found.emulated, found.slowdown]))
"""


@pytest.mark.slow  # 8 s of processes: the default suite stays near 4 min
def test_processes_share_the_verdict_whatever_their_own_probe_reads(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, tmp_path, None)
    readings = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", SUBPROCESS, str(tmp_path / "cpuinfo"), slowdown],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        for slowdown in ("40", "1", "40", "0.5")
    ]
    assert readings == [[True, 40.0]] * 4  # the first process's verdict, read by the others


def test_every_command_reads_the_one_verdict(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, tmp_path, None)
    noisy_probe(monkeypatch)  # emulated first, native on every second asking
    warning = emulation_warning(CPU, "bf16")  # train (runtime.py), generate, eval
    assert warning is not None and "is emulated on this CPU" in warning
    assert plan.probe_entry(CPU, "bf16")["emulated"] is True  # bench
    cfg = load_config(None, ["precision.mode=bf16", "run.device=cpu"])
    assert machine_facts.precision_facts(cfg, CPU)[1] == [warning]  # validate
    from speedtronic.cli import model as model_cli

    notes: list[str] = []
    monkeypatch.setattr(model_cli, "_note", notes.append)
    run = type("Run", (), {"precision_mode": "bf16"})()
    model_cli._precision(run, "cpu")  # generate
    assert notes == [warning]
    assert ns_precision(CPU) is torch.float32  # Muon's Newton-Schulz dtype (train)


def test_bench_reports_a_native_verdict_whatever_its_sizing_probe_reads(monkeypatch, tmp_path):
    # The machine: AVX512-BF16 and AMX, and a busy moment making bf16 look 5x slower.
    fake_cpu(monkeypatch, tmp_path, X86 + " avx512_bf16 amx_bf16")
    from speedtronic.train import precision

    probe = precision.MatmulProbe("bf16", 64, 5e-4)
    monkeypatch.setattr(precision, "matmul_slowdown", lambda device, mode: (5.0, probe))
    entry = plan.probe_entry(CPU, "bf16")
    assert entry["emulated"] is False and entry["verdict"]["basis"] == "cpu flags"
    assert emulation_warning(CPU, "bf16") is None


def test_the_timing_takes_the_best_of_interleaved_rounds(monkeypatch):
    # Both dtypes cost the same; every third call is stalled 40x by "another process". One
    # round alone would read a dtype 40x slower; the best of the rounds reads them equal.
    calls = itertools.count(1)

    def mm(a, b, *, out=None):
        end = time.thread_time() + (0.02 if next(calls) % 3 == 0 else 0.0005)
        while time.thread_time() < end:
            pass
        return out

    monkeypatch.setattr(torch, "mm", mm)
    assert 0.5 < emulation.timed_slowdown("bf16", size=8, rounds=4) < 2.0


def test_the_real_timing_runs_and_gives_back_the_threads():
    threads = torch.get_num_threads()
    assert emulation.timed_slowdown("bf16", size=32, rounds=2) > 0
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("emulated", [True, False])
def test_validate_reads_the_cached_verdict_not_a_probe_of_its_own(monkeypatch, emulated):
    # The real CPU and torch: the file is written where this machine's key points, so this
    # means the same on any CPU. A probe that would say otherwise is never asked.
    from typer.testing import CliRunner

    from speedtronic.cli.app import app

    path = emulation.cache_path("bf16")
    path.parent.mkdir(parents=True)
    kept = {"mode": "bf16", "emulated": emulated, "basis": "timing", "slowdown": 412.0}
    path.write_text(json.dumps({**kept, "size": 128}))
    monkeypatch.setattr(emulation, "decide", lambda mode: pytest.fail("decided again"))
    result = CliRunner().invoke(
        app, ["validate", "--set", "precision.mode=bf16", "--set", "run.device=cpu"]
    )
    assert result.exit_code == 0, result.output
    assert ("412x slower than fp32 (a 128x128 probe)" in result.stderr) is emulated

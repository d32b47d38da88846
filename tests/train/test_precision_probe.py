"""The emulation probe in ``speedtronic.train.precision``: cheap, cached, time-boxed, its warning.

Whether this CPU emulates bf16 is not assumed anywhere: the warning tests inject the machine's
verdict (how it is made: tests/train/test_emulation_verdict.py), and the time-box test makes
bf16 matmuls 400x slower than fp32 on purpose (a busy loop standing in for software
emulation), so every test means the same on any CPU.
"""

from __future__ import annotations

import time

import pytest
import torch

from speedtronic.train import emulation, precision
from speedtronic.train.precision import emulation_warning, probe_matmul

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """Each test probes from scratch (the cache is per process)."""
    monkeypatch.setattr(precision, "_PROBES", {})


def test_the_probe_is_cheap_cached_and_restores_the_thread_count():
    # CPU time of this thread (the probe runs on it alone), not wall time: on a loaded
    # machine the wall clock measures the other processes too
    threads = torch.get_num_threads()
    start = time.thread_time()
    probe = probe_matmul(CPU, "fp32")
    assert time.thread_time() - start < 0.2  # milliseconds on any CPU
    assert probe.size in precision.PROBE_SIZES and probe.seconds > 0 and probe.gflops > 0
    start = time.thread_time()
    assert probe_matmul(CPU, "fp32") is probe  # cached: no second measurement
    assert time.thread_time() - start < 1e-3
    assert torch.get_num_threads() == threads  # the probe runs on one thread, then gives back


def test_a_pinned_size_is_measured_at_that_size():
    assert probe_matmul(CPU, "bf16", size=64).size == 64


def emulated_bf16_mm(slowdown_gflops: float):
    """torch.mm whose bf16 calls burn CPU like a software emulation at ``slowdown_gflops``."""
    real_mm = torch.mm

    def mm(a, b, *, out=None):
        if a.dtype == torch.bfloat16:
            # Burns this thread's CPU time, which is the probe's clock on CPU.
            end = time.thread_time() + 2 * a.shape[0] ** 3 / (slowdown_gflops * 1e9)
            while time.thread_time() < end:
                pass
        return real_mm(a, b, out=out)

    return mm


def test_a_400x_emulated_dtype_is_probed_within_50_ms(monkeypatch):
    # ~0.3 GFLOP/s: the bf16 rate that made a 2048x2048 block take 257 s (issue 10).
    monkeypatch.setattr(torch, "mm", emulated_bf16_mm(0.3))
    cpu = time.thread_time()
    factor, probe = precision.matmul_slowdown(CPU, "bf16")
    cpu = time.thread_time() - cpu
    assert probe.size == 64  # 128 was predicted at ~14 ms a call: over the per-call box
    assert factor > 20  # far beyond EMULATION_FACTOR however fast fp32 is here
    # Without the box: 64, 128 and 256, 4 calls each = 0.5 s of CPU. CPU time, not wall
    # time: another process may hold the cores meanwhile (issue 21).
    assert cpu < 0.05, cpu


def judged(monkeypatch, found):
    monkeypatch.setattr(emulation, "verdict", lambda mode: found)


def test_the_warning_reports_an_emulated_mode_with_its_factor(monkeypatch):
    judged(monkeypatch, emulation.Verdict("bf16", True, "timing", 412.0, 64))
    message = emulation_warning(CPU, "bf16")
    assert message == (
        "precision.mode: bf16 is emulated on this CPU: its matmuls run 412x slower than fp32 "
        "(a 64x64 probe); set precision.mode: fp32 unless you need these numerics"
    )
    assert "\n" not in message


def test_the_warning_names_the_flags_when_they_decided(monkeypatch):
    judged(monkeypatch, emulation.Verdict("bf16", True, "cpu flags"))
    assert emulation_warning(CPU, "bf16") == (
        "precision.mode: bf16 is emulated on this CPU: its flags list no avx512_bf16 or "
        "amx_bf16; set precision.mode: fp32 unless you need these numerics"
    )


@pytest.mark.parametrize("basis", ["cpu flags", "timing"])
def test_native_modes_get_no_warning(monkeypatch, basis):
    judged(monkeypatch, emulation.Verdict("bf16", False, basis, 3.9, 128))
    assert emulation_warning(CPU, "bf16") is None


def test_fp32_and_gpus_are_never_probed(monkeypatch):
    def fail(mode):
        raise AssertionError("probed")

    monkeypatch.setattr(emulation, "verdict", fail)
    assert emulation_warning(CPU, "fp32") is None
    assert emulation_warning(torch.device("cuda"), "bf16") is None
    assert emulation_warning(torch.device("mps"), "fp16") is None


def test_a_kernel_missing_from_the_build_is_not_a_crash(monkeypatch):
    def missing(mode):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")

    monkeypatch.setattr(emulation, "verdict", missing)
    assert emulation_warning(CPU, "fp16") is None


def test_the_real_probe_runs_end_to_end():
    # Hardware-neutral: whatever this CPU does, the answer is None or one line naming bf16,
    # and it costs milliseconds of this thread's CPU time (wall time would count a busy
    # machine's other processes too).
    start = time.thread_time()
    message = emulation_warning(CPU, "bf16")
    assert time.thread_time() - start < 0.2
    assert message is None or message.startswith("precision.mode: bf16 is emulated on this CPU")

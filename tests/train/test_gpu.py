"""The ``gpu`` tier: CUDA-only paths, skipped cleanly without CUDA (see ``conftest.py``).

bf16 autocast, fp16 with GradScaler, the fused AdamW kernel, ``torch.compile`` without an
eager fallback, the pinned-memory loader, and ``bench`` on a GPU. Run with
``python -m pytest -q -m gpu`` (``benchmarks/gpu_check.sh`` does, on a CUDA machine).
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu


class Recorder:
    def __init__(self):
        self.losses, self.warnings = [], []

    def on_event(self, event, payload):
        if event == "train_step":
            self.losses.append(payload["loss"])
        elif event == "warning":
            self.warnings.append(payload["message"])


def run_on_cuda(tiny, **sections):
    """Build the tiny run on CUDA with ``sections`` merged in, train it; (runtime, recorder)."""
    from speedtronic.runtime import build_runtime

    tiny["run"].update(device="cuda", max_steps=12)
    tiny.update(sections)
    recorder = Recorder()
    runtime = build_runtime(tiny, console=False, hooks=[recorder])
    runtime.trainer.fit()
    return runtime, recorder


def assert_learns(recorder):
    assert len(recorder.losses) >= 3 and all(math.isfinite(x) for x in recorder.losses)
    assert recorder.losses[-1] < recorder.losses[0]


def test_bf16_autocast_trains(tiny):
    import torch

    runtime, recorder = run_on_cuda(tiny, precision={"mode": "bf16"})
    assert runtime.precision.mode == "bf16" and runtime.precision.dtype == torch.bfloat16
    assert runtime.trainer.scaler is None  # bf16 has fp32's range: no scaling
    assert_learns(recorder)
    assert not recorder.warnings


def test_fp16_uses_a_grad_scaler(tiny):
    runtime, recorder = run_on_cuda(tiny, precision={"mode": "fp16"})
    scaler = runtime.trainer.scaler
    assert runtime.precision.mode == "fp16" and scaler is not None
    assert math.isfinite(scaler.get_scale()) and scaler.get_scale() > 0
    assert runtime.trainer.skipped_steps <= 2  # at most the scale's first calibrations
    assert_learns(recorder)


def test_fused_adamw_is_used_on_cuda(tiny):
    runtime, recorder = run_on_cuda(tiny, optimizer={"lr": 1e-2, "fused": True})
    assert runtime.optimizer_kernel == "fused"
    assert runtime.optimizer.defaults.get("fused") is True
    assert not any("fused" in w for w in recorder.warnings)
    assert_learns(recorder)


def test_compile_runs_without_falling_back(tiny):
    runtime, recorder = run_on_cuda(tiny, compile=True, precision={"mode": "bf16"})
    assert not any("torch.compile" in w for w in recorder.warnings), recorder.warnings
    assert_learns(recorder)


def test_the_loader_pins_memory_for_cuda(tiny):
    import torch

    from speedtronic.config import SpeedtronicConfig
    from speedtronic.data import build_dataloader

    tiny["data"]["num_workers"] = 1
    loader = build_dataloader(SpeedtronicConfig.load(tiny), device=torch.device("cuda"))
    assert loader.pin_memory is True
    batch = next(iter(loader))
    assert batch["input_ids"].is_pinned() and batch["labels"].is_pinned()


def test_bench_on_cuda(tiny):
    from cli.test_bench import SCHEMA, check

    from speedtronic.bench import BenchOptions, run_bench

    tiny["run"]["device"] = "cuda"
    options = BenchOptions(quick=True, matmul_size=1024, min_time_s=0.1, copy_mib=64)
    doc = run_bench(tiny, options)
    check(doc, SCHEMA)
    caps = doc["device"]["capabilities"]
    assert doc["device"]["backend"] == "cuda" and caps["fp16"]
    assert "fp16" in doc["model"]["modes"]
    for name in ["fp32", "fp16"] + (["bf16"] if caps["bf16"] else []):
        assert doc["peaks"]["matmul"][name]["tflops"] > 0
    if caps["tf32"]:
        assert doc["peaks"]["matmul"]["tf32"]["tflops"] > 0
    if doc["peaks"]["vendor_tflops"]["low_precision"] is not None:  # a GPU in the table
        assert doc["model"]["modes"]["fp16"]["mfu_vendor_peak"] > 0

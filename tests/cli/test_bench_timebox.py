"""``speedtronic bench`` on slow or emulated hardware: sizes, time boxes, skips and verdicts.

Nothing here depends on what this CPU can do: matmul timings and probe results are injected,
so an "emulated bf16" is simulated the same way on a CPU with AMX as on an AVX2-only one
(issue 10: bf16 emulated at ~0.3 GFLOP/s made ``bench --quick`` take 383 s).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cli.test_bench import SCHEMA, check, sample_doc, verdict
from speedtronic.bench import BenchContext, BenchOptions, alternate, plan, raw, run_bench
from speedtronic.bench import run as bench_run
from speedtronic.config import SpeedtronicConfig
from speedtronic.train import emulation, precision
from speedtronic.train.precision import MatmulProbe

CPU = torch.device("cpu")
EMULATED_GFLOPS = 0.3  # bf16 on the AVX2-only CPU of issue 10
FAST_GFLOPS = 200.0  # fp32 on this project's 2-core development CPU


def modeled_matmuls(monkeypatch, gflops, cliff_at=None):
    """Replace the one-call timer by an n^3 model; returns the (size, seconds) calls made.

    From side ``cliff_at`` on, calls run 10x slower per flop (emulation did: 2.6 GFLOP/s at
    512, 0.3 at 2048).
    """
    calls = []

    def fake(name, size, device, give_up_s=float("inf")):
        rate = gflops / (10 if cliff_at and size >= cliff_at else 1)
        seconds = 2 * size**3 / (rate * 1e9)
        calls.append((size, seconds))
        return seconds

    monkeypatch.setattr(plan, "time_matmul_call", fake)
    return calls


# ---- matmul sizes -------------------------------------------------------------------------


def test_a_fast_dtype_climbs_to_the_default_size(monkeypatch):
    calls = modeled_matmuls(monkeypatch, FAST_GFLOPS)
    assert plan.fit_matmul_size("fp32", CPU, 2048, budget=0.28, start=256) == 2048
    assert [size for size, _ in calls] == [256, 512, 1024, 2048]  # 2048: 86 ms a call


def test_an_emulated_dtype_gets_a_size_whose_calls_fit_the_budget(monkeypatch):
    calls = modeled_matmuls(monkeypatch, EMULATED_GFLOPS)
    size = plan.fit_matmul_size("bf16", CPU, 2048, budget=0.28, start=64)
    assert size == 256  # 0.11 s a call; 512 would take 0.9 s and 2048 57 s
    assert [size for size, _ in calls] == [64, 128, 256]  # 512 was predicted over: not run
    assert sum(seconds for _, seconds in calls) < 0.15


def test_a_size_that_overruns_its_prediction_is_dropped_after_one_call(monkeypatch):
    calls = modeled_matmuls(monkeypatch, 2.6, cliff_at=1024)
    assert plan.fit_matmul_size("bf16", CPU, 2048, budget=1.0, start=128) == 512
    assert [size for size, _ in calls] == [128, 256, 512, 1024]  # 1024: 8 s, not 0.8


def test_an_explicit_size_is_honoured_when_it_fits(monkeypatch):
    calls = modeled_matmuls(monkeypatch, FAST_GFLOPS)
    assert plan.fit_matmul_size("fp32", CPU, 1500, budget=0.28, start=256) == 1500
    assert [size for size, _ in calls] == [256, 512, 1024, 1500]
    calls = modeled_matmuls(monkeypatch, FAST_GFLOPS)
    assert plan.fit_matmul_size("fp32", CPU, 128, budget=0.28, start=256) == 128
    assert [size for size, _ in calls] == [128]


def test_the_probe_picks_the_size_and_the_ladder_runs_only_when_it_must(tiny, monkeypatch):
    calls = modeled_matmuls(monkeypatch, EMULATED_GFLOPS)
    ctx = probed(quick_context(tiny), bf16_slowdown=400.0, fp32_step_s=0.06)
    ctx.doc["probe"]["fp32"]["seconds"] = 2 * 64**3 / (FAST_GFLOPS * 1e9)
    assert plan.peak_matmul_size(ctx, "fp32", 2048) == 2048 and calls == []
    assert plan.peak_matmul_size(ctx, "bf16", 2048) == 256  # emulated: the ladder decides
    assert calls[0][0] == 64  # from the probe's size up


# ---- model stages -------------------------------------------------------------------------


def quick_context(tiny, **options):
    return BenchContext(SpeedtronicConfig.load(tiny), BenchOptions(quick=True, **options), None)


def test_slow_steps_get_fewer_warm_up_steps_and_rounds(tiny):
    ctx = quick_context(tiny)  # 0.7 s rounds, 5 of them: a 4.4 s box per side
    assert plan.warm_steps(0.01, ctx) == 2 and plan.round_plan(0.01, ctx) == (70, 5)
    assert plan.warm_steps(2.0, ctx) == 1
    assert plan.round_plan(2.0, ctx) == (1, 2)  # 2 s steps: two one-step rounds
    assert plan.round_plan(60.0, ctx) == (1, 1)  # never fewer than one round of one step


def test_rounds_stop_at_the_budget_when_steps_turn_out_slower(monkeypatch):
    # A simulated clock: each step "takes" 0.05 s exactly. time.sleep(0.05) overslept to 0.08 s
    # on a loaded machine and the rounds stopped one early (issue 21).
    now = [0.0]

    def steps_of_50_ms(runtime, steps):
        now[0] += 0.05 * steps

    clock = SimpleNamespace(perf_counter=lambda: now[0], process_time=lambda: now[0])
    monkeypatch.setattr(raw, "time", clock)
    monkeypatch.setattr(raw, "run_trainer", steps_of_50_ms)
    runtime = SimpleNamespace(
        precision=SimpleNamespace(device=CPU, mode="bf16"),
        config=SimpleNamespace(tokens_per_step=128, run=SimpleNamespace(name="slow")),
    )
    timings = alternate(runtime, None, 0, steps=1, rounds=5, budget_s=0.125)
    assert len(timings.wall["trainer"]) == 3  # 0.05, 0.10, then 0.15 >= 0.125: stop
    assert len(alternate(runtime, None, 0, steps=1, rounds=5).wall["trainer"]) == 5


def probed(ctx, bf16_slowdown, fp32_step_s):
    """Put an injected probe and a measured configured (fp32) step time into ``ctx.doc``."""
    entry = {"size": 64, "seconds": 1e-3, "emulated": bf16_slowdown >= 4}
    ctx.doc["probe"] = {
        "fp32": {"size": 64, "seconds": 1e-5, "slowdown_vs_fp32": 1.0, "emulated": False},
        "bf16": {**entry, "slowdown_vs_fp32": bf16_slowdown},
    }
    ctx.doc["model"] = {"modes": {"fp32": {"step_time_s": fp32_step_s}}}
    return ctx


def test_an_emulated_mode_too_slow_for_its_box_is_skipped_with_a_reason(tiny):
    ctx = probed(quick_context(tiny), bf16_slowdown=400.0, fp32_step_s=0.06)
    reason = plan.skip_reason(ctx, "bf16")
    assert reason == (
        "bf16 is emulated on this CPU (400x slower than fp32 in a 64x64 probe matmul): "
        "a step would take about 24.0 s"
    )
    assert plan.skip_reason(ctx, "fp32") is None  # the configured mode is always measured


def test_an_emulated_mode_that_fits_its_box_is_measured(tiny):
    ctx = probed(quick_context(tiny), bf16_slowdown=25.0, fp32_step_s=0.01)
    assert plan.skip_reason(ctx, "bf16") is None  # 3 steps of 0.25 s fit 4.4 s
    ctx = probed(quick_context(tiny), bf16_slowdown=0.3, fp32_step_s=10.0)
    assert plan.skip_reason(ctx, "bf16") is None  # native: slow steps are the model's own


# ---- verdicts on an injected probe --------------------------------------------------------


def emulated_doc(configured="fp32", slowdown=400.0):
    doc = sample_doc()
    doc["model"]["configured"] = configured
    doc["peaks"]["matmul"]["bf16"].update(tflops=0.18 / slowdown, size=512)
    doc["peaks"]["matmul"]["fp32"]["size"] = 2048
    doc["probe"] = {
        "fp32": {"size": 64, "seconds": 1e-5, "slowdown_vs_fp32": 1.0, "emulated": False},
        "bf16": {"size": 64, "seconds": 4e-3, "slowdown_vs_fp32": 25.0, "emulated": True},
    }
    return doc


def test_an_emulated_dtype_is_reported_with_its_factor_and_advice():
    # The sizes say why this factor is not the device line's probe's (issue 21: "28x" in one
    # line and "41x" in another, unexplained)
    sizes = "(this line's 512x512 matmul against fp32's 2048x2048)"
    assert verdict(emulated_doc(), "matmul.bf16") == (
        "info",
        f"bf16 is emulated on this CPU: 400x slower than fp32 {sizes}; keep precision.mode: fp32",
    )
    assert verdict(emulated_doc(configured="bf16"), "matmul.bf16") == (
        "warn",
        f"bf16 is emulated on this CPU: 400x slower than fp32 {sizes}; set precision.mode: fp32",
    )


def test_the_device_line_believes_the_probe_over_the_cpu_flags():
    level, message = verdict(emulated_doc(), "device")
    assert level == "info"
    assert message.startswith("bf16 is emulated: 25x slower than fp32 in a 64x64 probe matmul")
    assert "the CPU lists AVX512-BF16; the math library ignores it" in message
    assert verdict(sample_doc(), "device") == ("ok", "native bf16 (AVX512-BF16)")


def test_an_emulated_configured_mode_has_no_mfu():
    doc = emulated_doc(configured="bf16")
    doc["model"]["modes"]["bf16"]["mfu_measured_peak"] = None
    assert verdict(doc, "model.bf16")[1] == "configured; MFU n/a (bf16 is emulated here)"


def test_measured_and_skipped_emulated_modes_say_so():
    doc = emulated_doc()
    doc["model"]["modes"]["bf16"].update(tokens_per_s=1_500, speedup_vs_configured=0.05)
    assert verdict(doc, "model.bf16") == ("info", "20x slower than fp32 (bf16 is emulated here)")
    del doc["model"]["modes"]["bf16"]
    doc["model"]["skipped"] = {"bf16": "bf16 is emulated on this CPU (...)"}
    assert verdict(doc, "model.bf16") == (
        "info",
        "not measured: bf16 is emulated on this CPU (...)",
    )


# ---- end to end, with an injected 400x emulated bf16 ----------------------------------


def emulated_verdict(monkeypatch):
    """The machine's verdict (``emulation.verdict``), which decides "emulated" in bench too."""
    found = {m: emulation.Verdict(m, True, "timing", 400.0, 64) for m in ("bf16", "fp16")}
    monkeypatch.setattr(emulation, "verdict", found.__getitem__)


def test_bench_reports_an_emulated_mode_instead_of_measuring_it(tiny, monkeypatch):
    monkeypatch.setattr(
        precision, "matmul_slowdown", lambda device, mode: (400.0, MatmulProbe(mode, 64, 2e-3))
    )
    emulated_verdict(monkeypatch)
    events = []
    options = BenchOptions(quick=True, min_time_s=0.1, rounds=2, matmul_size=256, copy_mib=16)
    doc = run_bench(tiny, options, lambda event, payload: events.append((event, payload)))
    check(doc, SCHEMA)
    assert doc["probe"]["bf16"]["emulated"] and not doc["probe"]["fp32"]["emulated"]
    assert list(doc["model"]["modes"]) == ["fp32"]
    assert "would take about" in doc["model"]["skipped"]["bf16"]
    assert verdict(doc, "model.bf16")[1].startswith("not measured: bf16 is emulated")
    assert verdict(doc, "matmul.bf16")[1].startswith("bf16 is emulated on this CPU: ")
    labels = [p["label"] for e, p in events if e == "stage_start"]
    assert "model bf16 (emulated: skipped)" in labels and "matmul bf16 (emulated)" in labels
    # fp32 is configured: bf16's emulation is the table's news, not a warning worded as a
    # fault of the user's precision.mode (issue 21)
    warnings = [p["message"] for e, p in events if e == "warning"]
    assert not [w for w in warnings if "emulated" in w], warnings


def test_only_the_configured_modes_emulation_is_a_warning(tiny, monkeypatch):
    monkeypatch.setattr(
        precision, "matmul_slowdown", lambda device, mode: (400.0, MatmulProbe(mode, 64, 2e-3))
    )
    emulated_verdict(monkeypatch)
    for configured, expected in (("fp32", []), ("bf16", ["bf16"])):
        tiny["precision"] = {"mode": configured}
        warnings = []
        ctx = BenchContext(
            SpeedtronicConfig.from_dict(tiny),
            BenchOptions(quick=True),
            lambda e, p, w=warnings: e == "warning" and w.append(p["message"]),
        )
        bench_run._device_stage(ctx)
        assert [w.split()[1] for w in warnings] == expected, warnings
        assert all(w.startswith("precision.mode: bf16 is emulated on this CPU") for w in warnings)


def test_the_probe_section_is_measured_for_real():
    # Hardware-neutral: the real probe runs and yields a positive slowdown either way.
    entry = plan.probe_entry(CPU, "bf16")
    assert entry["slowdown_vs_fp32"] > 0 and entry["size"] in (64, 128, 256)
    assert entry["emulated"] == emulation.verdict("bf16").emulated  # the machine's verdict

"""``speedtronic bench``: the JSON schema, the verdict logic on injected numbers, the CPU path.

The end-to-end run is the real ``--quick`` mode on a tiny model (one run per module, ~10 s);
its document feeds the schema and consistency tests. Verdicts are checked on hand-made
documents, so every branch is exercised with known numbers.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import TINY
from typer.testing import CliRunner

from speedtronic.bench import RawLoop, json_safe, repeat_timed, times, verdicts
from speedtronic.cli.app import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]

# ---- the schema, spelled out independently of the code that produces it ----------------

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
OPT_BOOL = (bool, type(None))


class Optional:
    def __init__(self, spec):
        self.spec = spec


class ListOf:
    def __init__(self, spec):
        self.spec = spec


class DictOf:
    def __init__(self, spec, may_be_empty=False):
        self.spec = spec
        self.may_be_empty = may_be_empty


MATMUL = {"tflops": NUM, "tflops_median": NUM, "size": int, "iterations": int, "seconds": NUM}
MATMUL["cpu_share"] = OPT_NUM
PROBE = {"size": int, "seconds": NUM, "slowdown_vs_fp32": NUM, "emulated": bool}
PROBE["verdict"] = Optional({"basis": str, "reason": str, "cache": OPT_STR})  # CPU, low precision
MODE = {
    "precision": str,
    "tokens_per_s": NUM,
    "step_time_s": NUM,
    "steps": int,
    "mfu_measured_peak": OPT_NUM,
    "mfu_vendor_peak": OPT_NUM,
    "peak_memory_gb": OPT_NUM,
    "data_wait_share": OPT_NUM,
    "cpu_share": OPT_NUM,
    "optimizer_share": OPT_NUM,
    "speedup_vs_configured": NUM,
    "final_loss": OPT_NUM,
}
SCHEMA = {
    "schema_version": int,
    "quick": bool,
    "elapsed_s": NUM,
    "config": {
        "name": str,
        "model": str,
        "params": int,
        "flops_per_token": NUM,
        "tokens_per_step": int,
        "micro_batch_size": int,
        "accumulation_steps": int,
        "seq_len": int,
        "precision": str,
        "compile": bool,
        "optimizer": str,
    },
    "device": {
        "name": str,
        "backend": str,
        "index": (int, type(None)),
        "memory_gb": OPT_NUM,
        "torch_version": str,
        "cuda_version": OPT_STR,
        "threads": int,
        "cpu_count": (int, type(None)),
        "capabilities": {
            "bf16": bool,
            "fp16": bool,
            "tf32": bool,
            "isa": ListOf(str),
            "cpu_capability": OPT_STR,
            "compute_capability": OPT_STR,
        },
    },
    "probe": DictOf(Optional(PROBE)),
    "peaks": {
        "matmul": {name: Optional(MATMUL) for name in ("fp32", "tf32", "bf16", "fp16")},
        "memory_copy": {
            "gb_per_s": NUM,
            "gb_per_s_median": NUM,
            "bytes": int,
            "iterations": int,
            "seconds": NUM,
            "cpu_share": OPT_NUM,
        },
        "vendor_tflops": {"fp32": OPT_NUM, "low_precision": OPT_NUM},
    },
    "model": {"configured": str, "modes": DictOf(MODE), "skipped": DictOf(str, may_be_empty=True)},
    "overhead": {
        "precision": str,
        "trainer_tokens_per_s": NUM,
        "raw_tokens_per_s": NUM,
        "ratio": NUM,
        "ratio_min": NUM,
        "ratio_max": NUM,
        "ratio_clean": OPT_NUM,
        "clean_rounds": int,
        "rounds": int,
        "steps_per_round": int,
    },
    "data": {
        "source": str,
        "num_workers": int,
        "pin_memory": bool,
        "batches": int,
        "tokens_per_s": NUM,
        "samples_per_s": NUM,
        "first_batch_s": NUM,
        "consumption_tokens_per_s": NUM,
        "headroom": NUM,
        "data_wait_share": OPT_NUM,
    },
    "checkpoint": {
        "bytes": int,
        "save_s": NUM,
        "load_s": NUM,
        "save_gb_per_s": NUM,
        "load_gb_per_s": NUM,
        "repeats": int,
        "interval": int,
        "directory": str,
    },
    "compile": {
        "enabled": bool,
        "precision": OPT_STR,
        "first_step_s": OPT_NUM,
        "compile_s": OPT_NUM,
        "eager_tokens_per_s": OPT_NUM,
        "compiled_tokens_per_s": OPT_NUM,
        "speedup": OPT_NUM,
        "fell_back": OPT_BOOL,
        "message": OPT_STR,
    },
    "verdicts": ListOf({"row": str, "level": str, "message": str}),
}


def check(value, spec, path="doc"):
    """Assert ``value`` matches ``spec``: exact key sets, types, finite numbers, no bool-as-int."""
    if isinstance(spec, Optional):
        if value is not None:
            check(value, spec.spec, path)
    elif isinstance(spec, ListOf):
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            check(item, spec.spec, f"{path}[{i}]")
    elif isinstance(spec, DictOf):
        assert isinstance(value, dict) and (value or spec.may_be_empty), path
        for key, item in value.items():
            check(item, spec.spec, f"{path}.{key}")
    elif isinstance(spec, dict):
        assert isinstance(value, dict), path
        assert set(value) == set(spec), (path, set(value) ^ set(spec))
        for key, item_spec in spec.items():
            check(value[key], item_spec, f"{path}.{key}")
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        assert isinstance(value, types), (path, value)
        if bool not in types:
            assert not isinstance(value, bool), (path, value)
        if isinstance(value, float):
            assert math.isfinite(value), (path, value)


# ---- the CPU path end to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """``speedtronic bench --quick --format json`` on the tiny model: (result, doc, seconds)."""
    config = copy.deepcopy(TINY)
    folder = tmp_path_factory.mktemp("bench")
    config["run"]["output_dir"] = str(folder / "run")
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    start = time.perf_counter()
    result = runner.invoke(app, ["bench", "-c", str(path), "--quick", "--format", "json"])
    seconds = time.perf_counter() - start
    assert result.exit_code == 0, result.stderr
    return result, json.loads(result.stdout), seconds


def low_precision_extras(doc: dict) -> set[str]:
    """The dtypes a bench probes beyond fp32 and bf16 on this CPU: fp16 where it has the ISA."""
    return {"fp16"} if doc["device"]["capabilities"]["fp16"] else set()


@pytest.mark.slow
def test_quick_bench_document_matches_the_schema(quick_run):
    _, doc, _ = quick_run
    check(doc, SCHEMA)
    assert doc["quick"] is True and doc["schema_version"] == 1
    assert doc["device"]["backend"] == "cpu"
    assert doc["model"]["configured"] == "fp32"
    # Every mode a CPU trains in, measured or, when the probe finds it emulated and too slow
    # for the time box, skipped with a reason; the configured mode is always measured.
    measured, skipped = list(doc["model"]["modes"]), list(doc["model"]["skipped"])
    assert measured[0] == "fp32" and sorted(measured + skipped) == ["bf16", "fp32"]
    assert all(doc["probe"][mode]["emulated"] for mode in skipped)
    assert doc["peaks"]["matmul"]["fp32"] and doc["peaks"]["matmul"]["bf16"]
    # fp16 is probed only where the CPU has fp16 arithmetic (AVX512-FP16, AMX-FP16)
    assert set(doc["probe"]) == {"fp32", "bf16"} | low_precision_extras(doc)
    assert doc["probe"]["fp32"]["slowdown_vs_fp32"] == 1
    assert doc["peaks"]["matmul"]["tf32"] is None  # TF32 is a CUDA thing
    assert doc["peaks"]["vendor_tflops"] == {"fp32": None, "low_precision": None}
    assert doc["compile"]["enabled"] is False and doc["compile"]["speedup"] is None


@pytest.mark.slow
def test_quick_bench_figures_are_consistent(quick_run):
    _, doc, _ = quick_run
    cfg, modes = doc["config"], doc["model"]["modes"]
    assert cfg["params"] > 0 and cfg["tokens_per_step"] == 8 * 16
    for mode, run in modes.items():
        assert run["precision"] == mode and run["steps"] >= 1  # slow modes: fewer, time-boxed
        assert run["tokens_per_s"] * run["step_time_s"] == pytest.approx(cfg["tokens_per_step"])
        peak = doc["peaks"]["matmul"][mode]["tflops"] * 1e12
        expected = cfg["flops_per_token"] * run["tokens_per_s"] / peak
        if doc["probe"][mode]["emulated"]:  # its peak is cut to fit the time box: no MFU
            expected = None
        assert run["mfu_measured_peak"] == pytest.approx(expected)
        assert run["mfu_vendor_peak"] is None  # no vendor table for CPUs: "n/a"
        assert run["peak_memory_gb"] > 0.01
    fp32 = modes["fp32"]
    if fp32["cpu_share"] >= 0.9:  # a busy machine slows steps: the time box then cuts them
        assert fp32["steps"] >= 3
    for run in modes.values():
        assert run["speedup_vs_configured"] == pytest.approx(
            run["tokens_per_s"] / fp32["tokens_per_s"]
        )
    overhead = doc["overhead"]
    assert overhead["trainer_tokens_per_s"] == fp32["tokens_per_s"]
    assert overhead["ratio_min"] <= overhead["ratio"] <= overhead["ratio_max"]
    # 5 rounds, fewer when they overran the stage's time box (a busy machine, slow steps).
    assert overhead["raw_tokens_per_s"] > 0 and 1 <= overhead["rounds"] <= 5
    data = doc["data"]
    assert data["source"] == "synthetic" and data["batches"] >= 2
    assert data["consumption_tokens_per_s"] == fp32["tokens_per_s"]
    assert data["headroom"] == pytest.approx(data["tokens_per_s"] / fp32["tokens_per_s"])
    ckpt = doc["checkpoint"]
    assert ckpt["bytes"] > 4 * cfg["params"]  # weights alone are 4 bytes per parameter
    assert ckpt["save_gb_per_s"] == pytest.approx(ckpt["bytes"] / ckpt["save_s"] / 1e9)


@pytest.mark.slow
def test_quick_bench_verdicts_cover_every_line(quick_run):
    _, doc, _ = quick_run
    rows = {v["row"] for v in doc["verdicts"]}
    expected = {"device", "matmul.fp32", "matmul.bf16", "memory_copy", "model.fp32"}
    expected |= {f"matmul.{mode}" for mode in low_precision_extras(doc)}
    assert expected | {"model.bf16", "overhead", "data", "checkpoint", "compile"} == rows
    assert {v["level"] for v in doc["verdicts"]} <= {"ok", "info", "warn"}


@pytest.mark.slow
def test_quick_bench_is_quick_and_reports_progress_on_stderr(quick_run):
    result, doc, seconds = quick_run
    assert doc["elapsed_s"] < seconds and doc["checkpoint"]["repeats"] == 2  # quick: 2 saves
    shares = [run["cpu_share"] for run in doc["model"]["modes"].values()]
    if min(shares) >= 0.9:  # on a busy machine threads wait for each other: no time limit then
        assert seconds < 30  # ~15 s on 2 idle cores
    lines = result.stderr.splitlines()
    stages = 8 + len(low_precision_extras(doc))  # one matmul stage per probed dtype
    assert lines[0].startswith(f"bench [1/{stages}] device facts")
    assert any(line.startswith(f"bench [{stages}/{stages}] ") for line in lines)
    assert "bench [" not in result.stdout  # progress never mixes into the data


def test_text_output_is_a_table_with_verdicts(tiny, tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny))
    args = ["bench", "-c", str(path), "--matmul-size", "128", "--min-time", "0.05"]
    result = runner.invoke(app, [*args, "--rounds", "2", "--set", "run.name=tablebench"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for needle in ("matmul fp32", "model fp32 (configured)", "model bf16", "engine overhead"):
        assert needle in out
    assert "the tokens training consumes" in out and "(synthetic, 0 workers)" in out
    assert "full run" in out and "tablebench" in out  # not --quick; --set applies
    assert not out.lstrip().startswith("{")


# ---- bad input ---------------------------------------------------------------------------


def one_line_error(result, *needles):
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speedtronic: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_bad_device_and_config_are_one_line_errors(tmp_path):
    one_line_error(runner.invoke(app, ["bench", "--device", "tpu"]), "run.device")
    missing = str(tmp_path / "nope.yaml")
    one_line_error(runner.invoke(app, ["bench", "-c", missing]), "not found")
    one_line_error(runner.invoke(app, ["bench", "--matmul-size", "0"]), "--matmul-size")
    args = ["bench", "--scratch-dir", str(tmp_path / "absent")]
    one_line_error(runner.invoke(app, args), "--scratch-dir")


def test_a_missing_gpu_is_a_usage_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    one_line_error(runner.invoke(app, ["bench", "--device", "cuda"]), "not available")


def test_help_documents_the_options_but_not_the_test_knobs():
    result = runner.invoke(app, ["bench", "--help"])
    assert result.exit_code == 0
    for option in ("--quick", "--format", "--device", "--config", "--scratch-dir"):
        assert option in result.stdout
    assert "--matmul-size" not in result.stdout and "--min-time" not in result.stdout


# ---- timing primitives and the shared raw loop -------------------------------------------


def test_repeat_timed_times_blocks_that_fill_the_budget(monkeypatch):
    import torch

    from speedtronic.bench import probes

    # A simulated clock: each call "takes" 2 ms of wall time and no CPU, exactly.
    # time.sleep(0.002) oversleeps on a loaded machine, which changed n (issue 21).
    now, calls = [0.0], []
    clock = SimpleNamespace(perf_counter=lambda: now[0], process_time=lambda: 0.0)
    monkeypatch.setattr(probes, "time", clock)

    def step():
        calls.append(1)
        now[0] += 0.002

    n, blocks, share = repeat_timed(step, torch.device("cpu"), seconds=0.06, repeats=3)
    assert n == 10 and len(blocks) == 3  # 0.02 s per block of 2 ms calls
    assert all(b == pytest.approx(n * 0.002) for b in blocks)  # a block is n calls
    assert len(calls) > 3 * n  # the warm-up calls were made but not timed
    assert share == 0  # sleeping uses no CPU: a share far below 1


def test_overhead_benchmark_shares_the_raw_loop():
    spec = importlib.util.spec_from_file_location(
        "overhead", ROOT / "benchmarks/engine/overhead.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.RawLoop is RawLoop


# ---- verdicts on injected numbers --------------------------------------------------------


def sample_doc(**changes):
    """A CPU document: fp32 configured at 30k tok/s, bf16 at 48k (1.6x), loader 35x."""
    doc = {
        "config": {"tokens_per_step": 2048},
        "device": {
            "backend": "cpu",
            "capabilities": {
                "bf16": True,
                "fp16": False,
                "tf32": False,
                "isa": ["avx2", "avx512f", "avx512_bf16"],
                "compute_capability": None,
            },
        },
        "peaks": {
            "matmul": {
                "fp32": {"tflops": 0.18, "cpu_share": 0.99},
                "tf32": None,
                "bf16": {"tflops": 0.40, "cpu_share": 1.0},
                "fp16": None,
            },
            "memory_copy": {"cpu_share": 0.98},
            "vendor_tflops": {"fp32": None, "low_precision": None},
        },
        "model": {
            "configured": "fp32",
            "modes": {
                "fp32": _mode("fp32", 30_000, 1.0),
                "bf16": _mode("bf16", 48_000, 1.6),
            },
        },
        "overhead": {"ratio": 0.99, "rounds": 3, "clean_rounds": 3},
        "data": {"headroom": 35.0, "data_wait_share": 0.01},
        "checkpoint": {"save_s": 0.05, "interval": 0},
        "compile": {"enabled": False},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = doc
        for key in parents:
            node = node[key]
        node[last] = value
    return doc


def _mode(precision, tokens_per_s, speedup):
    return {
        "precision": precision,
        "tokens_per_s": tokens_per_s,
        "step_time_s": 2048 / tokens_per_s,
        "mfu_measured_peak": 0.4,
        "mfu_vendor_peak": None,
        "cpu_share": 0.99,
        "speedup_vs_configured": speedup,
    }


def verdict(doc, row):
    found = [v for v in verdicts(doc) if v["row"] == row]
    assert len(found) == 1, found
    return found[0]["level"], found[0]["message"]


def test_a_faster_precision_mode_is_recommended():
    assert verdict(sample_doc(), "model.bf16") == (
        "warn",
        "bf16 would be 1.6x faster: set precision.mode: bf16",
    )
    level, message = verdict(sample_doc(), "model.fp32")
    assert level == "info" and message == "configured; MFU 40% of the measured fp32 matmul peak"


def test_a_slower_or_equal_mode_is_not_recommended():
    doc = sample_doc()
    doc["model"]["modes"]["bf16"].update(tokens_per_s=20_000, speedup_vs_configured=2 / 3)
    assert verdict(doc, "model.bf16") == ("info", "1.5x slower than fp32")
    assert verdict(doc, "model.fp32")[0] == "ok"  # the configured mode is the fastest
    doc["model"]["modes"]["bf16"].update(tokens_per_s=31_000, speedup_vs_configured=1.03)
    assert verdict(doc, "model.bf16") == ("info", "about as fast as fp32 (1.03x)")


def test_contention_is_called_out():
    # whose share: the measurement's own CPU time against what it asked for (issue 21: "8%
    # share" read as another process's)
    busy = "(the machine was busy: this measurement got {} of the CPU time it asked for; rerun"
    doc = sample_doc()
    doc["peaks"]["matmul"]["fp32"]["cpu_share"] = 0.6
    assert busy.format("60%") in verdict(doc, "matmul.fp32")[1]
    assert "busy" not in verdict(doc, "matmul.bf16")[1]
    doc["model"]["modes"]["fp32"]["cpu_share"] = 0.5
    assert busy.format("50%") in verdict(doc, "model.fp32")[1]
    assert "busy" not in verdict(doc, "model.bf16")[1]
    assert "--threads 1" not in verdict(doc, "model.fp32")[1]  # one thread waits for no other
    doc["device"]["threads"] = 2  # issue 55: a busy machine is named with what to do
    assert "train with --threads 1" in verdict(doc, "model.fp32")[1]
    assert "--threads" not in verdict(doc, "matmul.fp32")[1]


def test_low_gpu_mfu_gets_a_hint_and_vendor_mfu_is_shown():
    doc = sample_doc()
    doc["device"] = {"backend": "cuda", "capabilities": {"bf16": True, "fp16": True}}
    doc["device"]["capabilities"].update(tf32=True, compute_capability="9.0")
    doc["model"]["modes"]["fp32"].update(mfu_measured_peak=0.1, mfu_vendor_peak=0.05)
    level, message = verdict(doc, "model.fp32")
    assert level == "warn"
    assert "MFU 10% of the measured fp32 matmul peak, 5% of the vendor peak" in message
    assert "try compile: true" in message
    assert verdict(doc, "device") == ("info", "compute capability 9.0: bf16/fp16/tf32 tensor cores")


def test_an_optimizer_taking_a_large_share_of_the_step_is_named():
    doc = sample_doc()
    doc["model"]["modes"]["fp32"]["optimizer_share"] = 0.04
    assert "optimizer" not in verdict(doc, "model.fp32")[1]
    doc["model"]["modes"]["fp32"]["optimizer_share"] = 0.23
    level, message = verdict(doc, "model.fp32")
    assert level == "warn" and "the optimizer takes 23% of each step" in message


def test_peak_lines_compare_with_fp32_and_the_vendor_table():
    assert verdict(sample_doc(), "matmul.bf16") == ("info", "2.2x fp32's peak")
    doc = sample_doc(peaks__vendor_tflops={"fp32": 494.0, "low_precision": 989.0})
    doc["peaks"]["matmul"]["bf16"] = {"tflops": 700.0, "cpu_share": None}
    doc["peaks"]["matmul"]["fp32"] = {"tflops": 50.0, "cpu_share": None}
    assert verdict(doc, "matmul.bf16")[1] == "14x fp32's peak; 71% of the vendor's 989 TFLOP/s"


@pytest.mark.parametrize(
    ("headroom", "wait", "level", "message"),
    [
        (35.0, 0.01, "ok", "the data loader delivers 35x the tokens training consumes"),
        (1.5, 0.01, "warn", "the data loader delivers 1.5x the tokens training consumes, little"),
        (0.5, 0.01, "warn", "the data loader delivers 0.5x the tokens training consumes: training"),
        (3.0, 0.12, "warn", "the data loader delivers 3.0x the tokens training consumes; trai"),
    ],
)
def test_data_headroom_verdicts(headroom, wait, level, message):
    got = verdict(sample_doc(data={"headroom": headroom, "data_wait_share": wait}), "data")
    assert got[0] == level and got[1].startswith(message)


@pytest.mark.parametrize(
    ("ratio", "clean", "level", "message"),
    [
        (0.99, 3, "ok", "Trainer runs at 0.99x a raw PyTorch loop: overhead within the noise"),
        (0.93, 3, "info", "Trainer runs at 0.93x a raw PyTorch loop (7% overhead)"),
        (0.80, 3, "warn", "Trainer runs at 0.80x a raw PyTorch loop: 20% overhead; if a quiet"),
        (0.99, 1, "ok", "Trainer runs at 0.99x a raw PyTorch loop: overhead within the noise (2"),
    ],
)
def test_overhead_verdicts(ratio, clean, level, message):
    doc = sample_doc(overhead={"ratio": ratio, "rounds": 3, "clean_rounds": clean})
    got = verdict(doc, "overhead")
    assert got[0] == level and got[1].startswith(message)


def test_checkpoint_interval_cost():
    # steps take 2048 / 30000 = 68 ms; a 0.5 s save every 10 steps is 0.5 / 1.18 = 42%
    doc = sample_doc(checkpoint={"save_s": 0.5, "interval": 10})
    level, message = verdict(doc, "checkpoint")
    assert level == "warn" and "every 10 steps costs 42% of training time" in message
    doc = sample_doc(checkpoint={"save_s": 0.05, "interval": 1000})
    assert verdict(doc, "checkpoint")[0] == "ok"
    assert verdict(sample_doc(), "checkpoint") == (
        "info",
        "a save takes 0.05 s, 73% of one training step (0.068 s); saved only at the end",
    )
    # issue 21: "the time of 0.0 steps" for a save short against slow steps
    doc = sample_doc(checkpoint={"save_s": 0.21, "interval": 0})
    doc["model"]["modes"]["fp32"]["step_time_s"] = 100.0
    assert verdict(doc, "checkpoint")[1].startswith(
        "a save takes 0.21 s, under 1% of one training step (100 s)"
    )
    doc["model"]["modes"]["fp32"]["step_time_s"] = 0.01
    assert verdict(doc, "checkpoint")[1].startswith("a save takes 0.21 s, as long as 21.0 training")


def _compiled(speedup, compile_s=30.0, fell_back=False):
    return {
        "enabled": True,
        "fell_back": fell_back,
        "compile_s": compile_s,
        "speedup": speedup,
        "eager_tokens_per_s": 30_000.0,
        "compiled_tokens_per_s": 30_000.0 * speedup,
    }


def test_compile_verdicts():
    # eager 68.3 ms/step, compiled 48.8 ms: 30 s of compiling pays off after ~1538 steps
    level, message = verdict(sample_doc(compile=_compiled(1.4)), "compile")
    assert level == "ok"
    assert (
        message
        == "torch.compile is 1.4x faster after 30 s of compiling (pays off after 1538 steps)"
    )
    level, message = verdict(sample_doc(compile=_compiled(0.7)), "compile")
    assert (level, message) == ("warn", "torch.compile is slower here (0.7x): set compile: false")
    assert verdict(sample_doc(compile=_compiled(1.02)), "compile")[0] == "info"
    assert verdict(sample_doc(compile=_compiled(1.0, fell_back=True)), "compile")[0] == "warn"
    assert verdict(sample_doc(), "compile")[0] == "info"


def test_ratio_formatting_and_json_safety():
    assert [times(x) for x in (35.2, 1.6, 1.03, 0.95, 0.5)] == [
        "35x",
        "1.6x",
        "1.03x",
        "0.95x",
        "0.5x",
    ]
    assert json_safe({"a": [float("nan"), 1.0], "b": float("inf"), "c": "x"}) == {
        "a": [None, 1.0],
        "b": None,
        "c": "x",
    }

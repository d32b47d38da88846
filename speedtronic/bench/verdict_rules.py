"""Verdicts: a bench document in, one short judgement per table line out.

This module owns the rules that turn measured numbers into advice (a faster precision mode,
loader headroom, engine overhead, checkpoint cost, torch.compile, an emulated dtype) and their
thresholds. It is pure: it reads a document (``speedtronic.bench.run_bench``'s or a hand-made
one in the tests) and never measures anything. Every verdict must read right to someone who
has not read docs/benchmarks.md (issue 21): a ratio says what it compares (two sizes of
matmul are named as such), a share says whose it is, and a small number keeps its digits.
"""

from __future__ import annotations

from typing import Any

WORTH_SWITCHING = 1.10  # a precision mode or compile this much faster is worth a config change
HEADROOM_OK = 2.0  # data loader this many times faster than the model consumes: fine
OVERHEAD_OK = 0.97  # Trainer / raw loop at or above this is within the noise (~+-3%)
OVERHEAD_WARN = 0.90
CONTENDED = 0.90  # CPU share below this: another process disturbed the measurement
CHECKPOINT_COST_WARN = 0.05  # saves costing more than this share of training time
# optimizer.step this share of a step: Muon's Newton-Schulz costs per matrix, not per token
OPTIMIZER_SHARE_WARN = 0.15


def verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    """One short judgement per table row: ``{"row", "level" (ok/info/warn), "message"}``.

    Rows: ``device``, ``matmul.<dtype>``, ``memory_copy``, ``model.<mode>``, ``overhead``,
    ``data``, ``checkpoint``, ``compile``. Pure: tests feed it injected numbers.
    """
    rules = (_device_verdicts, _peak_verdicts, _model_verdicts, _overhead_verdicts)
    rules += (_data_verdicts, _checkpoint_verdicts, _compile_verdicts)
    return [verdict for rule in rules for verdict in rule(doc)]


def _verdict(row: str, level: str, message: str) -> dict[str, str]:
    return {"row": row, "level": level, "message": message}


def times(x: float) -> str:
    """A speed ratio as people say it: 1.6x, 35x, 0.95x."""
    if x >= 9.95:
        return f"{x:.0f}x"
    return f"{x:.1f}x" if x >= 1.195 or x <= 0.805 else f"{x:.2f}x"


def seconds(x: float) -> str:
    """A duration in seconds as people say it: 0.068, 0.21, 3.5, 42, 1234."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _device_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    device, caps = doc["device"], doc["device"]["capabilities"]
    if device["backend"] == "cuda":
        units = [n for n in ("bf16", "fp16", "tf32") if caps[n]]
        what = "/".join(units) + " tensor cores" if units else "no low-precision tensor cores"
        return [
            _verdict("device", "info", f"compute capability {caps['compute_capability']}: {what}")
        ]
    if device["backend"] == "cpu":
        native = [f.upper().replace("_", "-") for f in caps["isa"] if "bf16" in f or "amx" in f]
        probe = emulated_probe(doc, "bf16")
        if probe is not None:  # the machine's verdict (emulation.verdict), as train warns
            message = f"bf16 is emulated: {probe['slowdown_vs_fp32']:.0f}x slower than fp32 in a "
            message += f"{probe['size']}x{probe['size']} probe matmul"
            if caps["bf16"]:  # the verdict was timed: an ISA cap or a build without oneDNN
                message += f" (the CPU lists {', '.join(native)}; the math library ignores it)"
            return [_verdict("device", "info", message)]
        if caps["bf16"]:
            return [_verdict("device", "ok", f"native bf16 ({', '.join(native)})")]
        return [_verdict("device", "info", "no native bf16: bf16 autocast is emulated here")]
    return []


def emulated_probe(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The probe entry of ``name`` when the probe found it emulated, else None.

    Documents without a probe section (hand-made ones in tests, older ones) have none.
    """
    entry = (doc.get("probe") or {}).get(name)
    return entry if entry and entry["emulated"] else None


def _emulated_matmul(doc: dict[str, Any], name: str, slowdown: float) -> dict[str, str]:
    """``name`` is emulated: say how much slower, at which sizes, and which precision.mode to
    use. An emulated dtype is measured at a smaller matmul than fp32 (it must fit the time
    box), and the device line's probe at a smaller one still: the sizes explain the factors."""
    configured = doc["model"]["configured"]
    message = f"{name} is emulated on this CPU: {times(slowdown)} slower than fp32"
    sizes = [(doc["peaks"]["matmul"][n] or {}).get("size") for n in (name, "fp32")]
    if all(sizes):
        message += f" (this line's {sizes[0]}x{sizes[0]} matmul against fp32's "
        message += f"{sizes[1]}x{sizes[1]})"
    if configured == name:
        return _verdict(f"matmul.{name}", "warn", message + "; set precision.mode: fp32")
    advice = "; keep precision.mode: fp32" if configured == "fp32" else ""
    return _verdict(f"matmul.{name}", "info", message + advice)


def _peak_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    peaks, out = doc["peaks"], []
    matmul, vendor = peaks["matmul"], peaks["vendor_tflops"]
    fp32 = matmul["fp32"]["tflops"] if matmul.get("fp32") else None
    for name, peak in matmul.items():
        if not peak:
            continue
        if name == "fp32":
            message = "the fp32 limit; MFU below is measured against these peaks"
        elif fp32 and emulated_probe(doc, name):
            out.append(_emulated_matmul(doc, name, fp32 / peak["tflops"]))
            continue
        else:
            message = f"{times(peak['tflops'] / fp32)} fp32's peak" if fp32 else ""
        table = vendor["fp32"] if name in ("fp32", "tf32") else vendor["low_precision"]
        if table and name != "fp32":  # the table's fp32 column is TF32 on NVIDIA GPUs
            message += f"; {peak['tflops'] / table:.0%} of the vendor's {table:g} TFLOP/s"
        out.append(_verdict(f"matmul.{name}", "info", message + _contention(peak["cpu_share"])))
    message = "bounds element-wise work (norms, optimizer)"
    share = peaks["memory_copy"]["cpu_share"]
    out.append(_verdict("memory_copy", "info", message + _contention(share)))
    return out


def _model_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    model, backend = doc["model"], doc["device"]["backend"]
    configured, modes = model["configured"], model["modes"]
    best = max(modes, key=lambda m: modes[m]["tokens_per_s"])
    out = []
    for mode, row in modes.items():
        speed = row["speedup_vs_configured"]
        if mode == configured:
            level, message = "ok" if best == mode else "info", f"configured; {_mfu_text(doc, row)}"
            if backend == "cuda" and (row["mfu_measured_peak"] or 1) < 0.2:
                level = "warn"
                message += "; small matmuls or overhead dominate: try compile: true or a larger "
                message += "data.micro_batch_size"
            share = row.get("optimizer_share")
            if share is not None and share >= OPTIMIZER_SHARE_WARN:
                level = "warn"
                message += f"; the optimizer takes {share:.0%} of each step: a larger "
                message += "data.target_batch_size spreads its fixed cost over more tokens"
        elif mode == best and speed >= WORTH_SWITCHING:
            level, message = "warn", f"{mode} would be {times(speed)} faster: "
            message += f"set precision.mode: {mode}"
        elif speed >= 1 / WORTH_SWITCHING and speed < WORTH_SWITCHING:
            level, message = "info", f"about as fast as {configured} ({times(speed)})"
        elif speed > 1:
            level, message = "info", f"{times(speed)} faster than {configured}"
        else:
            level, message = "info", f"{times(1 / speed)} slower than {configured}"
        if mode != configured and emulated_probe(doc, mode):
            message += f" ({mode} is emulated here)"
        busy = _contention(row["cpu_share"], doc["device"].get("threads"))
        out.append(_verdict(f"model.{mode}", level, message + busy))
    for mode, reason in model.get("skipped", {}).items():
        out.append(_verdict(f"model.{mode}", "info", f"not measured: {reason}"))
    return out


def _mfu_text(doc: dict[str, Any], row: dict[str, Any]) -> str:
    measured, vendor = row["mfu_measured_peak"], row["mfu_vendor_peak"]
    if measured is None and emulated_probe(doc, row["precision"]):
        return f"MFU n/a ({row['precision']} is emulated here)"
    if measured is None:
        return "MFU n/a (no measured peak for this dtype)"
    text = f"MFU {measured:.0%} of the measured {row['precision']} matmul peak"
    return text + (f", {vendor:.0%} of the vendor peak" if vendor is not None else "")


def _contention(share: float | None, threads: int | None = None) -> str:
    """Whose share: the CPU time this measurement got, of what its threads asked for; for a
    training measurement on several threads, what a user can do while the machine stays busy."""
    if share is None or share >= CONTENDED:
        return ""
    hint = "rerun when quiet"
    if threads is not None and threads > 1:  # they wait for each other (issue 55)
        hint += "; while it stays busy, train with --threads 1 (docs/troubleshooting.md)"
    got = f"this measurement got {share:.0%} of the CPU time it asked for"
    return f" (the machine was busy: {got}; {hint})"


def _overhead_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    o = doc["overhead"]
    ratio = o["ratio"]
    message = f"Trainer runs at {ratio:.2f}x a raw PyTorch loop"
    if ratio >= OVERHEAD_OK:
        level, message = "ok", message + ": overhead within the noise"
    elif ratio >= OVERHEAD_WARN:
        level, message = "info", message + f" ({1 - ratio:.0%} overhead)"
    else:
        level = "warn"
        message += f": {1 - ratio:.0%} overhead; if a quiet rerun agrees, please report it"
    if o["clean_rounds"] < o["rounds"]:
        busy = o["rounds"] - o["clean_rounds"]
        message += f" ({busy} of {o['rounds']} rounds ran while other processes used the CPU)"
    return [_verdict("overhead", level, message)]


def _data_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    d = doc["data"]
    headroom, wait = d["headroom"], d["data_wait_share"]
    delivers = f"the data loader delivers {times(headroom)} the tokens training consumes"
    if headroom >= HEADROOM_OK:
        level, message = "ok", delivers
    elif headroom >= 1:
        level, message = "warn", f"{delivers}, little to spare: raise data.num_workers"
    else:
        level = "warn"
        message = f"{delivers}: training waits for data; raise data.num_workers"
    if wait is not None and wait > 0.05:
        level, message = "warn", message + f"; training waited for data {wait:.0%} of the time"
    return [_verdict("data", level, message)]


def _checkpoint_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    c = doc["checkpoint"]
    step_s = doc["model"]["modes"][doc["model"]["configured"]]["step_time_s"]
    steps, save = c["save_s"] / step_s, seconds(c["save_s"])
    if steps >= 1:
        message = f"a save takes {save} s, as long as {steps:.1f} training steps"
    else:  # a share of one step: "the time of 0.0 steps" said nothing
        share = f"{steps:.0%}" if steps >= 0.005 else "under 1%"
        message = f"a save takes {save} s, {share} of one training step ({seconds(step_s)} s)"
    interval = c["interval"]
    if not interval:
        return [_verdict("checkpoint", "info", message + "; saved only at the end")]
    share = c["save_s"] / (interval * step_s + c["save_s"])
    if share > CHECKPOINT_COST_WARN:
        message += f"; every {interval} steps costs {share:.0%} of training time: raise "
        return [_verdict("checkpoint", "warn", message + "checkpoint.interval")]
    return [_verdict("checkpoint", "ok", message + f"; every {interval} steps costs {share:.1%}")]


def _compile_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    c = doc["compile"]
    if not c["enabled"]:
        return [_verdict("compile", "info", "off in this config (compile: true measures it)")]
    if c["fell_back"]:
        message = "torch.compile failed, training ran eagerly: set compile: false"
        return [_verdict("compile", "warn", message)]
    speed, compile_s = c["speedup"], c["compile_s"]
    if speed >= WORTH_SWITCHING:
        step = doc["config"]["tokens_per_step"]
        saved = step / c["eager_tokens_per_s"] - step / c["compiled_tokens_per_s"]
        message = f"torch.compile is {times(speed)} faster after {compile_s:.0f} s of compiling"
        return [
            _verdict("compile", "ok", message + f" (pays off after {compile_s / saved:.0f} steps)")
        ]
    if speed >= 1 / WORTH_SWITCHING:
        message = f"torch.compile makes little difference ({times(speed)}) "
        return [_verdict("compile", "info", message + f"and takes {compile_s:.0f} s to compile")]
    message = f"torch.compile is slower here ({times(speed)}): set compile: false"
    return [_verdict("compile", "warn", message)]

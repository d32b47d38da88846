#!/usr/bin/env bash
# GPU check, one CUDA GPU, under 10 minutes:
#   1. the test suite's gpu tier (bf16/fp16 paths, GradScaler, fused AdamW, compile, pinned loader)
#   2. GPT-2 small (configs/gpt2_small.yaml: ~124M params, seq 1024, bf16 + fused AdamW +
#      torch.compile) trained for $STEPS steps: tokens/s and MFU (target on H100/H200: >= 40%);
#      then the same with optimizer.name: muon (issue 30): its tokens/s and loss at equal steps
#      over AdamW's, a ratio measured in the same session
#   3. `speedtronic bench --quick --format json` for GPT-2 small (compile on and off), then
#      benchmarks/engine/matmul_check.py: its matmul peaks against a plain torch.mm loop (<= 15%)
#   4. `speedtronic bench --quick --format json` on the default smoke config
#   5. with 2+ GPUs: benchmarks/engine/ddp_scaling.py, 1 rank against all of them (>= 90% per GPU at 8)
#   6. benchmarks/optim/time_to_quality.py at its large size (4.5M) on the GPU, seed 0: Muon over
#      AdamW to the frozen target, in time and in steps
#
# Usage:   benchmarks/gpu_check.sh
# Env:     OUT (default /tmp/gpu_check): small outputs (JSON, logs, summary) land here
#          WORK (default /tmp/gpu_check_work): the training run's directory (a 1.5 GB checkpoint)
#          STEPS (default 100), BUDGET_S (default 560: stages are cut to fit), PYTHON
#          TRAIN_CONFIG (default configs/gpt2_small.yaml); ALLOW_CPU=1 runs without CUDA, to
#          rehearse the script itself (e.g. TRAIN_CONFIG=configs/smoke.yaml STEPS=20)
# Exit:    0 when every stage passed and the MFU target was met, 1 otherwise, 2 without CUDA.
# Installs the repo (pip install -e .[dev]) only when speedtronic or pytest is not importable.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/gpu_check}"
WORK="${WORK:-/tmp/gpu_check_work}"
STEPS="${STEPS:-100}"
BUDGET_S="${BUDGET_S:-560}"
PY="${PYTHON:-python}"
TRAIN_CONFIG="${TRAIN_CONFIG:-configs/gpt2_small.yaml}"
MFU_TARGET=0.40
mkdir -p "$OUT" "$WORK"
START=$(date +%s)
declare -A STATUS=()
ORDER=()

log() {
  printf '[gpu_check %4ds] %s\n' "$(($(date +%s) - START))" "$*" | tee -a "$OUT/gpu_check.log" >&2
}

# stage NAME LIMIT_S STDOUT_FILE CMD...: runs CMD under a time limit (cut to what is left of
# BUDGET_S), stdout to STDOUT_FILE, stderr to $OUT/NAME.stderr; records the outcome and never
# aborts the script, so one failure still leaves every other figure.
stage() {
  local name=$1 limit=$2 out=$3 rc=0
  shift 3
  ORDER+=("$name")
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if ((left < 20)); then
    STATUS[$name]="SKIPPED (time budget spent)"
    log "skip $name: ${left}s left"
    return 0
  fi
  if ((limit > left)); then limit=$left; fi
  log "start $name (limit ${limit}s)"
  timeout --signal=INT --kill-after=30 "$limit" "$@" >"$out" 2>"$OUT/$name.stderr" || rc=$?
  case $rc in
    0) STATUS[$name]=ok ;;
    124) STATUS[$name]="TIMEOUT after ${limit}s" ;;
    *) STATUS[$name]="FAILED (exit $rc, see $OUT/$name.stderr)" ;;
  esac
  log "end $name: ${STATUS[$name]}"
}

# ---- set-up ------------------------------------------------------------------------------
if ! "$PY" -c "import speedtronic, pytest" >/dev/null 2>&1; then
  log "speedtronic or pytest not importable: pip install -e .[dev]"
  "$PY" -m pip install -e ".[dev]" >"$OUT/pip.log" 2>&1
fi
if [[ ${ALLOW_CPU:-0} != 1 ]] &&
  ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  log "no CUDA device visible to torch: nothing to check"
  exit 2
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -c "
import json, platform, torch, speedtronic
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
print(json.dumps({'gpu': gpu, 'torch': torch.__version__,
                  'cuda': torch.version.cuda, 'python': platform.python_version(),
                  'speedtronic': speedtronic.__version__}))" >"$OUT/env.json"
log "environment: $(cat "$OUT/env.json")"

# ---- stages, most important first --------------------------------------------------------
# Only the files that hold gpu tests: a GPU image may lack what others import (boto3, moto), and
# one failed collection would stop the tier (seen on the H200 image, 2026-12-04)
mapfile -t GPU_TESTS < <(grep -rlE 'mark\.gpu' tests --include='test_*.py' | sort)
stage tests 100 "$OUT/pytest_gpu.txt" "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider \
  "${GPU_TESTS[@]}"

rm -rf "$WORK/train"
stage train 170 "$OUT/train.stdout" speedtronic train -c "$TRAIN_CONFIG" \
  --max-steps "$STEPS" --output-dir "$WORK/train" --set logging.json_file=metrics.jsonl
cp "$WORK/train/metrics.jsonl" "$OUT/train_metrics.jsonl" 2>/dev/null || true

rm -rf "$WORK/train_muon"
stage train_muon 170 "$OUT/train_muon.stdout" speedtronic train -c "$TRAIN_CONFIG" \
  --max-steps "$STEPS" --output-dir "$WORK/train_muon" --set logging.json_file=metrics.jsonl \
  --set optimizer.name=muon --set checkpoint.interval=0 --set checkpoint.keep_last=1
cp "$WORK/train_muon/metrics.jsonl" "$OUT/train_muon_metrics.jsonl" 2>/dev/null || true
rm -rf "$WORK/train_muon"

# --quick: 5 rounds of ~0.7 s per mode; compile (on in this config) is measured too.
stage bench_gpt2_small 170 "$OUT/bench_gpt2_small.json" \
  speedtronic bench -c "$TRAIN_CONFIG" --quick --format json

if [[ ${STATUS[bench_gpt2_small]} == ok ]]; then
  stage matmul_check 40 "$OUT/matmul_check.txt" "$PY" benchmarks/engine/matmul_check.py \
    --compare "$OUT/bench_gpt2_small.json" --dtypes fp32 tf32 bf16 fp16 --seconds 1
fi

stage bench_smoke 50 "$OUT/bench_smoke.json" speedtronic bench --quick --format json

# 5. DDP scaling on every visible GPU (benchmarks/engine/ddp_scaling.py): 1 rank against N, GPT-2 small;
#    target >= 90% per GPU at 8 GPUs. Skipped with fewer than 2 GPUs (nothing to scale to).
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if ((NGPU >= 2)); then
  stage ddp_scaling 240 "$OUT/ddp_scaling.txt" "$PY" benchmarks/engine/ddp_scaling.py \
    --config "$TRAIN_CONFIG" --ranks 1 "$NGPU" --steps 40 --warmup 15
else
  log "skip ddp_scaling: $NGPU GPU(s) visible, needs 2 or more"
fi

stage ttq_large 150 "$OUT/ttq_large.txt" "$PY" benchmarks/optim/time_to_quality.py --size large \
  --device cuda --arms muon --seeds 0 --no-aa --threads 4 --out "$OUT/ttq_large.json"

# ---- summary -----------------------------------------------------------------------------
STAGES=""
for name in "${ORDER[@]}"; do STAGES+="$name=${STATUS[$name]};"; done
rc=0
STAGES="$STAGES" OUT="$OUT" MFU_TARGET="$MFU_TARGET" ELAPSED="$(($(date +%s) - START))" \
  "$PY" - <<'PYEOF' || rc=$?
import json
import os
import statistics
import sys
from pathlib import Path

out = Path(os.environ["OUT"])
stages = dict(item.split("=", 1) for item in os.environ["STAGES"].split(";") if item)
summary = {"elapsed_s": int(os.environ["ELAPSED"]), "stages": stages}


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


lines = []


def train_figures(path):
    if not path.exists():
        return None
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in steps if r.get("event") == "train_step"]
    # The first two log windows hold torch.compile and the warm-up: leave them out.
    steady = [r for r in steps if r["step"] > 50] or steps[-1:]
    if not steady:
        return None
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    return {
        "steps": steps[-1]["step"],
        "final_loss": steps[-1]["loss"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "mfu": statistics.median(mfus) if mfus else None,
        "data_wait_share": statistics.median(r["data_wait_share"] for r in steady),
        "memory_bytes": steady[-1].get("memory_bytes"),
    }


train = train_figures(out / "train_metrics.jsonl")
if train:
    summary["train_gpt2_small"] = train
    mfu = train["mfu"]
    target = float(os.environ["MFU_TARGET"])
    summary["mfu_target_met"] = mfu is not None and mfu >= target
    lines.append(
        f"GPT-2 small train: {train['tokens_per_s']:,.0f} tok/s, MFU "
        + (f"{mfu:.1%}" if mfu is not None else "n/a (GPU not in the peak table)")
        + f" (target {target:.0%}: {'met' if summary['mfu_target_met'] else 'NOT met'}), "
        f"data wait {train['data_wait_share']:.1%}, final loss {train['final_loss']:.3f} "
        f"after {train['steps']} steps"
    )
muon = train_figures(out / "train_muon_metrics.jsonl")
if muon and train:
    summary["train_gpt2_small_muon"] = muon
    speed = muon["tokens_per_s"] / train["tokens_per_s"]
    summary["muon_over_adamw"] = {"tokens_per_s": speed, "final_loss": muon["final_loss"]}
    lines.append(
        f"GPT-2 small with Muon: {muon['tokens_per_s']:,.0f} tok/s = {speed:.3f}x AdamW's; "
        f"final loss {muon['final_loss']:.3f} vs {train['final_loss']:.3f} after "
        f"{muon['steps']} steps"
    )
ttq = load("ttq_large.json")
if ttq:
    summary["time_to_quality_large"] = ttq["summary"]
    for row in ttq["summary"]:
        lines.append(
            f"time to quality, 4.5M, {row['arm']}: time ratio {row['time_ratio']}, "
            f"steps ratio {row['steps_ratio']}, optimizer share {row['optimizer_share']}"
        )
for name in ("bench_smoke.json", "bench_gpt2_small.json"):
    doc = load(name)
    if not doc:
        continue
    peaks = {k: round(v["tflops"], 1) for k, v in doc["peaks"]["matmul"].items() if v}
    modes = {
        k: {"tokens_per_s": round(v["tokens_per_s"]), "mfu_vendor": v["mfu_vendor_peak"]}
        for k, v in doc["model"]["modes"].items()
    }
    compiled = doc["compile"]
    summary[name] = {
        "device": doc["device"]["name"],
        "matmul_tflops": peaks,
        "memory_copy_gb_per_s": round(doc["peaks"]["memory_copy"]["gb_per_s"]),
        "modes": modes,
        "overhead_ratio": doc["overhead"]["ratio"],
        "data_headroom": doc["data"]["headroom"],
        "compile_speedup": compiled["speedup"],
        "compile_s": compiled["compile_s"],
        "verdicts": [f"{v['row']}: {v['message']}" for v in doc["verdicts"]],
    }
    lines.append(f"{name}: peaks {peaks} TFLOP/s; overhead {doc['overhead']['ratio']:.3f}; "
                 f"modes {modes}")
    if doc["model"]["configured"] in doc["model"]["modes"] and compiled["speedup"]:
        lines.append(f"  compile {compiled['speedup']:.2f}x after {compiled['compile_s']:.0f} s")
check = out / "matmul_check.txt"
if check.exists():
    agree = [line for line in check.read_text().splitlines() if line.startswith("bench agrees")]
    summary["matmul_check"] = agree[0] if agree else "no comparison"
    lines.append(f"matmul_check: {summary['matmul_check']}")
tests = out / "pytest_gpu.txt"
if tests.exists():
    tail = [line for line in tests.read_text().splitlines() if line.strip()][-1:]
    summary["tests"] = tail[0] if tail else ""
    lines.append(f"gpu tests: {summary['tests']}")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print("==== gpu_check summary ====")
for name, status in stages.items():
    print(f"  {name:<18} {status}")
for line in lines:
    print(line)
print(f"elapsed {summary['elapsed_s']} s; outputs in {out}")
failed = any(s != "ok" for s in stages.values()) or not summary.get("mfu_target_met", False)
sys.exit(1 if failed else 0)
PYEOF
exit $rc

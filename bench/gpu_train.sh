#!/usr/bin/env bash
# GPU throughput on one NVIDIA GPU (written for an H200): generation tokens/s and RL train-step
# throughput of a ~100M-parameter Qwen2-style model built locally (bf16, no downloads).
#
#   bash bench/gpu_train.sh [WORK_DIR] [-- extra options for every section of gpu_train.py]
#
# WORK_DIR (default outputs/gpu_train) receives the corpus, the model and gpu_train.json; when
# $OUT is set (the device runner's output folder) the JSON and the log are copied there.
# Sections run in separate processes: check, prepare, generate, vllm (skipped with a message
# when vLLM does not import), train (run_rl, DeepSpeed ZeRO-2). Exits 2 without a CUDA GPU.
set -euo pipefail

cd "$(dirname "$0")/.."
WORK="${1:-outputs/gpu_train}"
shift || true
[[ "${1:-}" == "--" ]] && shift
EXTRA=("$@")

# Offline and quiet: nothing is fetched, nothing reports home.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export DO_NOT_TRACK=1 MLFLOW_DISABLE_TELEMETRY=true VLLM_NO_USAGE_STATS=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

PY="${PYTHON:-python}"
run() { "$PY" bench/gpu_train.py "$1" --work "$WORK" "${EXTRA[@]}"; }

if ! "$PY" bench/gpu_train.py check; then
    echo "gpu_train.sh: stopping: no CUDA GPU (see the message above)." >&2
    exit 2
fi
mkdir -p "$WORK"
LOG="$WORK/gpu_train.log"
: > "$LOG"
set +e  # keep the status of the sections, and copy what there is to $OUT either way
{
    set -e
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
    run prepare
    run generate
    run vllm || echo "vllm section failed (rc $?); the other figures stand"
    run train
    echo "figures: $WORK/gpu_train.json"
} 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
set -e
if [[ -n "${OUT:-}" ]]; then
    cp "$LOG" "$OUT/" 2>/dev/null || true
    cp "$WORK/gpu_train.json" "$OUT/" 2>/dev/null || true
fi
exit "$status"

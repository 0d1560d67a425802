#!/usr/bin/env bash
# The prepared GPU check (bench/README.md): on one GPU of an offline machine, the GPU-relevant
# tests, RL throughput of a 0.5B-shaped model under ZeRO-2 and ZeRO-3 against model.generate,
# and, given a model, a real model through the cpu-smollm2 recipe (SFT, RL, EX at each end); one table, also in OUT_DIR/gpu_check.{json,md}.
#
#   bash bench/gpu_check.sh [OUT_DIR] [--wheels DIR] [--cpu-smoke] [options of bench/gpu_check.py]
#
# OUT_DIR (default outputs/gpu_check) also holds each part's log and work/ (corpus, models, runs).
# --wheels DIR: install the wheels `make gpu-wheels` gathered (nothing else, no index) into
# OUT_DIR/site first. --cpu-smoke: tiny sizes on a CPU, to check the script (the test suite runs
# it). Without a CUDA GPU and without --cpu-smoke it says so and exits 2. When $OUT is set (a
# device runner's output folder) the table, the JSON and the logs are copied there.
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=outputs/gpu_check
if [[ $# -gt 0 && "$1" != -* ]]; then DIR="$1"; shift; fi
WHEELS=""
ARGS=()
SMOKE=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --cpu-smoke) SMOKE=1; ARGS+=("$1"); shift ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

# Offline and quiet: nothing is fetched, nothing reports home.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export DO_NOT_TRACK=1 MLFLOW_DISABLE_TELEMETRY=true VLLM_NO_USAGE_STATS=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
mkdir -p "$DIR"
if [[ -n "$WHEELS" ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$DIR/site" "$WHEELS"/*.whl
    export PYTHONPATH="$PWD/$DIR/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [[ $SMOKE -eq 0 ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)"; then
    echo "gpu_check.sh: no CUDA GPU is visible (torch.cuda.is_available() is False); this check needs one" \
         "(--cpu-smoke checks the script itself on a CPU)." >&2
    exit 2
fi
if [[ $SMOKE -eq 0 ]]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
fi
set +e
"$PY" bench/gpu_check.py --out "$DIR" "${ARGS[@]}" 2>&1 | tee "$DIR/gpu_check.log"
status=${PIPESTATUS[0]}
set -e
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    cp "$DIR"/gpu_check.{json,md,log} "$OUT/" 2>/dev/null || true
    tar -czf "$OUT/gpu_check_logs.tgz" -C "$DIR/work" $(cd "$DIR/work" && ls *.log *.json *.xml 2>/dev/null) 2>/dev/null || true
fi
exit "$status"

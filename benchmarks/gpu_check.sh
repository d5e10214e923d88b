#!/usr/bin/env bash
# The GPU check of keras-isobn, for a GPU host with JAX and/or PyTorch but no
# TensorFlow, Keras, KerasHub or network (a rented GPU box), in two steps:
#
#   1. On a CPU machine with this package: writes OUT (<= 60 MB: SST-2 token
#      ids, the MiniLM checkpoint in float16, wheels of keras and keras-hub):
#        benchmarks/gpu_check.sh bundle GLUE_DIR OUT [-- gpu_bundle ARGS]
#   2. On the GPU host, from this repository, with OUT copied there:
#        benchmarks/gpu_check.sh run OUT [--output DIR] [--backends "jax torch"]
#            [--small] [--no-hf] [--timeout S]
#      installs the bundle's wheels into OUT/site, then runs, each in a fresh
#      process, `python -m benchmarks.gpu_check run` per backend, `hf` (when
#      `transformers` is there) and `merge`: DIR/gpu_check.json (default
#      gpu_check_results/), PASS/FAIL per check, the goals and a summary.
#      Exit code 0 when all checks pass.
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "gpu_check: $1" >&2; [[ $2 -eq 2 ]] && usage >&2; exit "$2"; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}" PYTHONUNBUFFERED=1
# JAX must not take the whole GPU memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"

command="${1:-}"
[[ $# -gt 0 ]] && shift
case "$command" in
  -h|--help) usage; exit 0 ;;
  bundle)
    [[ $# -ge 2 ]] || fail "bundle needs GLUE_DIR and OUT." 2
    GLUE_DIR="$1"; OUT="$2"; shift 2
    [[ "${1:-}" == "--" ]] && shift
    exec "$PYTHON" -m benchmarks.gpu_bundle "$OUT" --glue-dir "$GLUE_DIR" "$@" ;;
  run) ;;
  *) fail "give a command, bundle or run." 2 ;;
esac

BUNDLE="" OUTPUT="gpu_check_results" BACKENDS="jax torch" HF=1 TIMEOUT=1200
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --small) ARGS+=(--small); shift ;;
    --output) OUTPUT="$2"; shift 2 ;;
    --backends) BACKENDS="$2"; shift 2 ;;
    --no-hf) HF=0; shift ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    -*) fail "unknown option $1" 2 ;;
    *) BUNDLE="$1"; shift ;;
  esac
done
if [[ -z "$BUNDLE" || ! -f "$BUNDLE/manifest.json" ]]; then
  fail "FAIL '${BUNDLE}' is not a bundle (no manifest.json); build one with:
  benchmarks/gpu_check.sh bundle GLUE_DIR OUT" 2
fi
BUNDLE="$(cd "$BUNDLE" && pwd)"
mkdir -p "$OUTPUT"
OUTPUT="$(cd "$OUTPUT" && pwd)"
rm -f "$OUTPUT"/part_*.json "$OUTPUT/gpu_check.json"
if compgen -G "$BUNDLE/wheels/*.whl" > /dev/null; then
  # The bundle's versions, in a folder of their own, ahead of the host's.
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$BUNDLE/site" "$BUNDLE"/wheels/*.whl
  export PYTHONPATH="$BUNDLE/site:$PYTHONPATH"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader 2> /dev/null || true

START=$SECONDS
status=0
step() { echo "gpu_check: $1 ($((SECONDS - START)) s)"; }
for backend in $BACKENDS; do
  if ! "$PYTHON" -c "import $backend" 2> /dev/null; then
    echo "gpu_check: $backend is not installed; skipped."
    continue
  fi
  step "$backend"
  KERAS_BACKEND=$backend timeout "$TIMEOUT" "$PYTHON" -m benchmarks.gpu_check \
    run "$BUNDLE" --output "$OUTPUT" "${ARGS[@]}" || status=$?
done
if [[ $HF -eq 1 ]] && "$PYTHON" -c "import torch, transformers" 2> /dev/null
then
  step "HF Trainer"
  timeout "$TIMEOUT" "$PYTHON" -m benchmarks.gpu_check hf "$BUNDLE" \
    --output "$OUTPUT" "${ARGS[@]}" || status=$?
fi
"$PYTHON" -m benchmarks.gpu_check merge "$OUTPUT" || status=1
if [[ $status -ne 0 ]]; then
  fail "FAIL ($((SECONDS - START)) s; see the FAIL lines above; JSON in $OUTPUT)" 1
fi
echo "gpu_check: PASS ($((SECONDS - START)) s, $OUTPUT/gpu_check.json)"

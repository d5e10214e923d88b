#!/usr/bin/env bash
# The GPU check of keras-isobn, for a GPU host with JAX and/or PyTorch but no
# TensorFlow, Keras, KerasHub or network (a rented GPU box), in two steps:
#
#   1. On any CPU machine with this package installed (`pip install -e .`):
#        benchmarks/gpu_check.sh bundle GLUE_DIR OUT [-- gpu_bundle ARGS]
#      writes OUT (<= 60 MB): SST-2 as token ids, the MiniLM checkpoint
#      (float16), wheels of keras and keras-hub. Copy OUT and this repository
#      to the GPU host.
#   2. On the GPU host, from this repository:
#        benchmarks/gpu_check.sh run OUT [--output DIR] [--backends "jax torch"]
#            [--small] [--no-hf] [--no-jit]
#      installs the bundle's wheels into OUT/site (nothing else is touched),
#      then, each in a fresh process: per backend, mixed_float16 fine-tuning
#      with IsoBN and its checks, examples/s with IsoBN / frozen IsoBN / none /
#      BN (and of the compiled step alone on JAX) and of our
#      optimizer against Keras's AdamW, the layer alone, mixed_bfloat16; then
#      HF Trainer on the same token ids when `transformers` is there; last,
#      PyTorch's jit_compile=True (--jit-timeout). Writes one JSON,
#      DIR/gpu_check.json (default: gpu_check_results/), prints PASS/FAIL per
#      check, the speed goals and a summary. Exit code 0 when all checks pass.
#
#   --small        small timings, for trying it on a CPU with a tiny bundle
#                  (`bundle GLUE OUT -- --checkpoint tiny --no-wheels ...`)
#   --timeout S    limit of each backend's process (default 1200)
#   --jit-timeout S  limit of each jit_compile=True process (default 300)
set -euo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"

command="${1:-}"
[[ $# -gt 0 ]] && shift
case "$command" in
  -h|--help) usage; exit 0 ;;
  bundle)
    if [[ $# -lt 2 ]]; then
      echo "gpu_check: bundle needs GLUE_DIR and OUT." >&2; usage >&2; exit 2
    fi
    GLUE_DIR="$1"; OUT="$2"; shift 2
    [[ "${1:-}" == "--" ]] && shift
    exec "$PYTHON" -m benchmarks.gpu_bundle "$OUT" --glue-dir "$GLUE_DIR" "$@"
    ;;
  run) ;;
  *) echo "gpu_check: give a command, bundle or run." >&2; usage >&2; exit 2 ;;
esac

BUNDLE=""
OUTPUT="gpu_check_results"
BACKENDS="jax torch"
ARGS=()
HF=1
JIT=1
TIMEOUT=1200
JIT_TIMEOUT=300
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --small) ARGS+=(--small); shift ;;
    --output) OUTPUT="$2"; shift 2 ;;
    --backends) BACKENDS="$2"; shift 2 ;;
    --no-hf) HF=0; shift ;;
    --no-jit) JIT=0; shift ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --jit-timeout) JIT_TIMEOUT="$2"; shift 2 ;;
    -*) echo "gpu_check: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) BUNDLE="$1"; shift ;;
  esac
done
if [[ -z "$BUNDLE" || ! -f "$BUNDLE/manifest.json" ]]; then
  echo "FAIL gpu_check: '${BUNDLE}' is not a bundle (no manifest.json); build" \
       "one with: benchmarks/gpu_check.sh bundle GLUE_DIR OUT" >&2
  exit 2
fi
BUNDLE="$(cd "$BUNDLE" && pwd)"
mkdir -p "$OUTPUT"
OUTPUT="$(cd "$OUTPUT" && pwd)"
rm -f "$OUTPUT"/part_*.json "$OUTPUT/gpu_check.json"

if compgen -G "$BUNDLE/wheels/*.whl" > /dev/null; then
  # The bundle's versions, in a folder of their own, ahead of the host's.
  echo "gpu_check: installing $(ls "$BUNDLE"/wheels | wc -l) wheels into $BUNDLE/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$BUNDLE/site" "$BUNDLE"/wheels/*.whl
  export PYTHONPATH="$BUNDLE/site:$PYTHONPATH"
fi
# JAX must not take the whole GPU memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
export PYTHONUNBUFFERED=1
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

START=$SECONDS
status=0
for backend in $BACKENDS; do
  if ! "$PYTHON" -c "import $backend" 2> /dev/null; then
    echo "gpu_check: $backend is not installed; skipped."
    continue
  fi
  if ! KERAS_BACKEND=$backend "$PYTHON" -c "import keras, keras_hub, keras_isobn.models" ; then
    echo "FAIL gpu_check: cannot import keras, keras_hub and keras_isobn.models" \
         "on $backend; build the bundle with its wheels." >&2
    exit 1
  fi
  echo "gpu_check: $backend ($((SECONDS - START)) s)"
  KERAS_BACKEND=$backend timeout "$TIMEOUT" "$PYTHON" -m benchmarks.gpu_check \
    run "$BUNDLE" --output "$OUTPUT" "${ARGS[@]}" || status=$?
done
if [[ $HF -eq 1 ]]; then
  if "$PYTHON" -c "import torch, transformers" 2> /dev/null; then
    echo "gpu_check: HF Trainer ($((SECONDS - START)) s)"
    timeout "$TIMEOUT" "$PYTHON" -m benchmarks.gpu_check hf "$BUNDLE" \
      --output "$OUTPUT" "${ARGS[@]}" || status=$?
  else
    echo "gpu_check: transformers is not installed; no HF Trainer beside."
  fi
fi
# Last, as it may take minutes to compile (or not finish): PyTorch's.
if [[ $JIT -eq 1 && " $BACKENDS " == *" torch "* ]] \
   && "$PYTHON" -c "import torch" 2> /dev/null; then
  echo "gpu_check: torch jit_compile=True ($((SECONDS - START)) s)"
  KERAS_BACKEND=torch timeout "$JIT_TIMEOUT" "$PYTHON" -m benchmarks.gpu_check \
    run "$BUNDLE" --output "$OUTPUT" --sections jit --part jit "${ARGS[@]}" \
    || echo "gpu_check: jit_compile=True ended with exit code $? (timeout: 124)"
fi
merged=0
"$PYTHON" -m benchmarks.gpu_check merge "$OUTPUT" || merged=$?
if [[ $status -ne 0 || $merged -ne 0 ]]; then
  echo "gpu_check: FAIL ($((SECONDS - START)) s; see the FAIL lines above; JSON in $OUTPUT)"
  exit 1
fi
echo "gpu_check: PASS ($((SECONDS - START)) s, $OUTPUT/gpu_check.json)"

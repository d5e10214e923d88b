#!/usr/bin/env bash
# Runs the whole test suite once per Keras backend (tensorflow, jax, torch).
# Fails if any backend fails or runs no test. The notebooks are executed once,
# on the TensorFlow backend. Extra arguments go to pytest.
# Usage: bash scripts/test.sh [pytest args]   (BACKENDS="jax" to run fewer)
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONDONTWRITEBYTECODE=1
status=0
summary=()
for backend in ${BACKENDS:-tensorflow jax torch}; do
  echo "=== KERAS_BACKEND=${backend}"
  extra=()
  if [ "${backend}" != "tensorflow" ]; then
    extra=(--ignore=tests/notebooks)
  fi
  KERAS_BACKEND="${backend}" python -m pytest -q -p no:cacheprovider "${extra[@]}" "$@"
  rc=$?
  if [ "${rc}" -eq 5 ]; then
    echo "!!! no test ran on ${backend}"
  fi
  if [ "${rc}" -ne 0 ]; then
    status=1
  fi
  summary+=("${backend}: exit ${rc}")
done
printf '%s\n' "=== summary" "${summary[@]}"
exit "${status}"

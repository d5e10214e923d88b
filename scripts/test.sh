#!/usr/bin/env bash
# Builds the docs (`mkdocs build --strict`: a broken link or a missing API
# reference fails it), then runs the whole test suite once per Keras backend
# (tensorflow, jax, torch). Fails if the docs build fails, or if any backend
# fails or runs no test. The notebooks are executed once, on the TensorFlow
# backend. Extra arguments go to pytest.
# Usage: bash scripts/test.sh [pytest args]   (BACKENDS="jax" to run fewer)
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONDONTWRITEBYTECODE=1
status=0
summary=()

echo "=== mkdocs build --strict"
site_dir="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "${site_dir}"
rc=$?
rm -rf "${site_dir}"
if [ "${rc}" -ne 0 ]; then
  status=1
fi
summary+=("docs: exit ${rc}")

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

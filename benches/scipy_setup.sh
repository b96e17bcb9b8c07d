#!/usr/bin/env bash
# Installs the scipy.stats reference (scipy 1.17.1, numpy 2.4.6; the versions the stored
# correlation fixtures were computed with) into .tools/scipyvenv and prints its python.
# Used by benches/correlate_scipy.sh and, through SYNTH_SCIPY_PYTHON, by the correlation
# tests that re-run tests/fixtures/correlate/reference_scipy.py live. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES="scipy==1.17.1 numpy==2.4.6"
venv=.tools/scipyvenv
if [ "$(cat "$venv/PACKAGES" 2>/dev/null)" != "$PACKAGES" ]; then
  python=$(command -v python3 || command -v python)
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --quiet $PACKAGES >&2
  echo "$PACKAGES" > "$venv/PACKAGES"
fi
echo "$PWD/$venv/bin/python"

#!/usr/bin/env bash
# Installs numpy, threadpoolctl and faiss-cpu into .tools/benchvenv (once) and runs
# benches/retrieve_python.py with the given arguments. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE,
# which this workplace sets for old OpenBLAS builds, are unset for the run (they slow a
# current numpy); the script prints the BLAS kernel it ran.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.tools/benchvenv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet numpy threadpoolctl faiss-cpu==1.15.1
fi
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$venv/bin/python" benches/retrieve_python.py "$@"

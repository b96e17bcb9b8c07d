#!/usr/bin/env bash
# Installs PyTorch + transformers (and TRL for the reference trainer, numpy and matplotlib for
# the neuron analysis' figures) into .tools/torchvenv, idempotently, and writes .tools/torchpy,
# the interpreter to run them with: the CPU path of `train` (the --tiny-random-llama smoke run)
# and of `neurons` (pipelines/analysis/neurons.py), which the tests run when .tools/torchpy can
# import them (they say why they skip otherwise).
#
# PyPI has no CPU-only torch for Linux x86_64: its wheel is the CUDA build and pulls the NVIDIA
# runtime wheels, which `import torch` loads even on a CPU (~1.7 GB of downloads, 5.7 GB
# installed). uv (from PyPI) downloads and unpacks them in parallel. Cold (no cache), on this
# 2-core VM while a release build ran beside it: 7 min 46 s wall, 34 s of CPU — the time is the
# download and the disk (BENCHMARKS.md, "Installing PyTorch for the CPU path").
# Pinned versions, so a re-run with the same list does nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=$(command -v python3 || command -v python)

# gguf (gguf-py): transformers loads a GGUF base model with it, and pipelines/trainers/export_gguf.py
# writes trained checkpoints back to GGUF for the local provider.
PACKAGES="torch==2.15.0 transformers==5.24.0 trl==1.16.0 datasets==5.2.0 accelerate==1.15.0 numpy==2.4.6 matplotlib==3.11.2 gguf==0.19.0"
UV="uv==0.13.9"
venv=.tools/torchvenv
if [ "$(cat .tools/torchpy.packages 2>/dev/null)" = "$PACKAGES" ] && [ -x .tools/torchpy ]; then
  exit 0
fi
echo "installing PyTorch for the CPU path ($PACKAGES) into $venv"
mkdir -p .tools
rm -f .tools/torchpy .tools/torchpy.packages
# A venv from an earlier list is kept: uv installs only what changed (torch is 1.7 GB).
if ! "$venv/bin/python" -c "" 2>/dev/null || [ ! -x "$venv/bin/uv" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "$UV"
fi
# One download, no cache left behind (the venv is the only copy).
"$venv/bin/uv" pip install --quiet --no-cache --python "$venv/bin/python" $PACKAGES
printf '#!/bin/sh\nexec "%s/%s/bin/python" "$@"\n' "$PWD" "$venv" > .tools/torchpy
chmod +x .tools/torchpy
.tools/torchpy -c "import torch, transformers, trl, matplotlib, gguf; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
echo "$PACKAGES" > .tools/torchpy.packages

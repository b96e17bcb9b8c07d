#!/usr/bin/env bash
# Packs what the GPU path of the whole loop needs into .tools/gpu (at most 64 MiB with the
# working tree): run it here, after the CPU loop
#   synth run pipelines/rolemrc.toml --profile local
#   synth run pipelines/rolemrc-train-eval.toml --profile local --until train
# then carry .tools/gpu to a GPU machine with PyTorch, transformers and accelerate (no network,
# no Rust, no TRL or gguf) and run pipelines/tools/gpu_loop.sh there (docs/methods/rolemrc.md).
#
# - model/ (MODEL=packed): the base model (the trainer's dequantized SmolLM2-135M-Instruct,
#   train/base) as 3-bit weights (pipelines/tools/compact_model.py: no GGUF of this model fits
#   64 MiB, and 3 bits cost perplexity ×37: the path at the model's size, not a usable model);
# - data/: the train stage's SFT / DPO files in TRL's layout and the test split;
# - wheels/: TRL, datasets and the pure-Python packages they need that such a machine lacks
#   (pyarrow, pandas and the like must be there: they do not fit).
set -euo pipefail
cd "$(dirname "$0")/../.."
LOOP=${LOOP:-outputs/rolemrc-train-eval-local}
DATA=${DATA:-outputs/rolemrc-local}
PY=${PY:-.tools/torchpy}
dest=.tools/gpu
for f in "$LOOP/train/base/model.safetensors" "$LOOP/train/train_data/sft.jsonl" "$LOOP/train/train_data/dpo.jsonl" "$DATA/test.jsonl"; do
  [ -f "$f" ] || { echo "gpu_pack: $f is missing (run the CPU loop's train stage first)" >&2; exit 1; }
done
rm -rf "$dest"
mkdir -p "$dest/data" "$dest/wheels"
# MODEL=packed (3-bit SmolLM2; measured to cost perplexity ×24–37, BENCHMARKS.md) or
# MODEL=tiny (default: nothing packed, gpu_loop.sh trains a tiny random Llama instead).
if [ "${MODEL:-tiny}" = packed ]; then
  "$PY" pipelines/tools/compact_model.py pack "$LOOP/train/base" "$dest/model" --group "${GROUP:-96}"
fi
cp "$LOOP/train/train_data/sft.jsonl" "$LOOP/train/train_data/dpo.jsonl" "$dest/data/"
cp "$DATA/test.jsonl" "$dest/data/test.jsonl"
# Pure-Python wheels only (any CPython): TRL and datasets with the small packages they pull.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest/wheels" \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 gguf==0.19.0 2>&1 | tail -3 || true
for pyv in 310 311 312 313; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyv" --platform manylinux2014_x86_64 \
    --dest "$dest/wheels" xxhash==4.1.0 2>&1 | tail -1 || true
done
du -sh "$dest" "$dest"/*

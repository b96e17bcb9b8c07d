#!/usr/bin/env bash
# The GPU path of the whole loop, as one command on a GPU machine without network, Rust, TRL
# or gguf (PyTorch, transformers and accelerate present), from the repository root with
# .tools/gpu packed by pipelines/tools/gpu_pack.sh:
#
#   pipelines/tools/gpu_loop.sh [OUT_DIR]      (default outputs/gpu-loop)
#
# 1. installs the carried wheels into .tools/gpu/site (no index, no network);
# 2. rebuilds the base model from its 3-bit weights;
# 3. trains it with the reference trainer, exactly the `local` profile's train stage but in
#    bfloat16 on the GPU: SFT then DPO, Table 8's recipe scaled down in steps only;
# 4. answers the test split with base, SFT and DPO through PyTorch (greedy, 256 tokens),
#    in the `generate` stage's columns (OUT_DIR/answers/answered_{base,sft,dpo}.jsonl);
# 5. writes OUT_DIR/gpu_loop.json: per step wall seconds, peak host memory and peak GPU
#    memory, the environment, and the trainer's final metrics.
# Back on a machine with synth, each OUT_DIR/answers file is a `source` for the metrics and
# judge stages (it has the columns of a `generate` stage's output).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-outputs/gpu-loop}
STEPS=${STEPS:-4}
PY=${PY:-python3}
pack=.tools/gpu
work=${WORK:-$OUT/work}   # checkpoints: keep them out of a folder that is shipped back
mkdir -p "$OUT" "$work"
log() { echo "gpu_loop: $*" >&2; }
[ -d "$pack/data" ] || { log "$pack/data is missing: run pipelines/tools/gpu_pack.sh where the CPU loop ran"; exit 1; }
# The model: the packed 3-bit SmolLM2 (MODEL=packed, when gpu_pack.sh packed one) or a tiny
# random Llama built from the data (MODEL=tiny: nothing carried; the path, not the model).
MODEL=${MODEL:-$([ -d "$pack/model" ] && echo packed || echo tiny)}

"$PY" - <<'PYEOF' | tee "$OUT/environment.json"
import json, platform, importlib.metadata as m
def v(p):
    try: return m.version(p)
    except Exception: return None
import torch
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.cuda.is_available(),
  "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
  "packages": {p: v(p) for p in ["transformers", "accelerate", "peft", "trl", "datasets", "pyarrow", "pandas", "gguf", "safetensors", "numpy"]}}))
PYEOF

# 1. The carried wheels, only where the machine lacks the package.
site=$pack/site
mkdir -p "$site"
missing=$("$PY" -c "
import importlib.util as u, os
force = os.environ.get('FORCE_WHEELS') == '1'
print(' '.join(p for p in ['trl','datasets','dill','multiprocess','fsspec','xxhash','gguf'] if force or u.find_spec(p) is None))")
if [ -n "$missing" ]; then
  log "installing carried wheels for: $missing"
  wheels=()
  for p in $missing; do wheels+=("$p"); done
  "$PY" -m pip install --quiet --no-index --no-deps --find-links "$pack/wheels" --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import trl, datasets, pyarrow" || { log "TRL or datasets cannot be imported (pyarrow and pandas must be on the machine; they do not fit the carried tree)"; exit 1; }

timed() { # name, command...: wall seconds and peak host RSS of one step into $OUT/<name>.time
  local name=$1; shift
  date +%s.%N > "$OUT/$name.start"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%M' -o "$OUT/$name.rss" "$@" 2>&1 | tee "$OUT/$name.log"
  else
    "$@" 2>&1 | tee "$OUT/$name.log"
  fi
  local rc=${PIPESTATUS[0]}
  date +%s.%N > "$OUT/$name.end"
  [ "$rc" = 0 ] || { log "$name failed (exit $rc); its last lines:"; tail -20 "$OUT/$name.log" >&2; exit "$rc"; }
}

# 2. The base model.
if [ "$MODEL" = packed ]; then
  timed unpack "$PY" pipelines/tools/compact_model.py unpack "$pack/model" "$work/base"
  base=$work/base
  tiny=()
else
  log "MODEL=tiny: a tiny random Llama built from the data stands in for SmolLM2"
  timed unpack true
  base=$work/train/tiny-random-llama
  tiny=(--tiny-random-llama)
fi
# 3. Train (the local profile's train stage, bf16 on the GPU).
timed train "$PY" pipelines/trainers/trl_train.py --sft "$pack/data/sft.jsonl" --dpo "$pack/data/dpo.jsonl" \
  --output-dir "$work/train" --base-model "$base" --sft-lr 1e-5 --dpo-lr 2e-5 --beta 0.1 \
  --batch-size 2 --grad-acc 8 --epochs 1 --warmup-ratio 0.04 --scheduler cosine --bf16 "${BF16:-true}" \
  --max-steps "$STEPS" --max-length 1024 --logging-steps 1 --full-determinism "${FULL_DET:-true}" "${tiny[@]}"
# 4. Generate with the three models.
timed generate "$PY" pipelines/tools/generate_hf.py --test "$pack/data/test.jsonl" \
  --model base="$base" --model sft="$work/train/sft" --model dpo="$work/train/dpo" \
  --out-dir "$OUT/answers" --max-new-tokens 256 --dtype "${DTYPE:-bfloat16}"
# 5. The record.
MODEL_USED=$MODEL "$PY" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
steps = {}
for name in ("unpack", "train", "generate"):
    rss = f"{out}/{name}.rss"
    steps[name] = {
        "seconds": round(float(open(f"{out}/{name}.end").read()) - float(open(f"{out}/{name}.start").read()), 2),
        "peak_rss_mib": int(open(rss).read().split()[-1]) / 1024 if os.path.exists(rss) else None,
    }
metrics, gen = {}, []
for line in open(f"{out}/train.log", encoding="utf-8", errors="replace"):
    if line.startswith("SYNTH_METRICS "):
        m = json.loads(line.split(" ", 1)[1]); metrics[m.pop("phase")] = m
for line in open(f"{out}/generate.log", encoding="utf-8", errors="replace"):
    if line.startswith("{"):
        gen.append(json.loads(line))
doc = {"model": os.environ.get("MODEL_USED"), "environment": json.load(open(f"{out}/environment.json")), "steps": steps, "train_metrics": metrics, "generate": gen}
json.dump(doc, open(f"{out}/gpu_loop.json", "w"), indent=1)
print(json.dumps(doc, indent=1))
PYEOF

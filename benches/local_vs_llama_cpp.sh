#!/usr/bin/env bash
# Output tokens/s of the `local` provider against llama.cpp's own C++ server (`llama-server`,
# built from the sdist llama-cpp-python==0.3.36 by benches/llama_cpp.sh: llama.cpp's defaults,
# -march=native, OpenMP) serving the same GGUF with PARALLEL slots and continuous batching, on
# the same requests: N short-story prompts, PARALLEL in flight, MAX_TOKENS, the same samplers
# named on both sides (llama-server's defaults: top_k 40, top_p 0.95, min_p 0.05, temperature
# 0.8; a request that names only the temperature gets them from the server but not from synth,
# which then samples from the whole vocabulary), in three forms: plain text; a JSON Schema
# (`schema`: the answers differ in length, as synth decodes compact JSON and the server's
# grammar lets the model pad it with whitespace, so the valid answers are counted too); and a
# schema whose one string must be longer than MAX_TOKENS can hold (`long`: every answer on both
# sides is MAX_TOKENS tokens of constrained JSON, the same work); ROUNDS rounds, each run right
# after its peer (only one of the two is up at a time). Then `llama-batched-bench` (PARALLEL
# sequences, 32-token prompts, MAX_TOKENS generated): llama.cpp's own decode ceiling here.
#   benches/local_vs_llama_cpp.sh [N] [MAX_TOKENS] [THREADS] [PARALLEL] [ROUNDS]
# SYNTH=path/to/synth compares another build; SYNTH_ALT=path/to/synth runs a second build in
# each round too, right after the first (e.g. one built with GGML_SYNTH_NATIVE=OFF: AVX2 code).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/llama_cpp.sh
. benches/lib.sh
N=${1:-64}; MAX_TOKENS=${2:-128}; THREADS=${3:-2}; PARALLEL=${4:-16}; ROUNDS=${5:-2}
W=$(mktemp -d /tmp/local-vs-llama-cpp-XXXX)
MODEL=$PWD/.tools/models/SmolLM2-135M-Instruct.Q4_1.gguf
SYNTH=${SYNTH:-$PWD/target/release/synth}
.ci/setup-model
llama_cpp_install
[ -n "${SYNTH_SKIP_BUILD:-}" ] || cargo build --release --quiet
story_inputs "$N"
GEN="temperature = 0.8
top_p = 0.95
extra = { top_k = 40, min_p = 0.05 }
max_tokens = $MAX_TOKENS
seed = 1"
LOCAL="kind = \"local\"
model = \"$MODEL\"
parallel = $PARALLEL
threads = $THREADS
max_concurrency = $PARALLEL
$GEN"
SERVER="kind = \"openai\"
base_url = \"http://127.0.0.1:8767/v1\"
model = \"smollm2\"
api_key_env = \"NO_KEY\"
structured_output = \"llama_cpp\"
max_concurrency = $PARALLEL
initial_concurrency = $PARALLEL
timeout_seconds = 3600
$GEN"
story_pipeline server-text "$SERVER" "" $PARALLEL
story_pipeline server-schema "$SERVER" 'schema = "story.schema.json"' $PARALLEL
story_pipeline local-text "$LOCAL" "" $PARALLEL
story_pipeline local-schema "$LOCAL" 'schema = "story.schema.json"' $PARALLEL
story_pipeline server-long "$SERVER" 'schema = "story-long.schema.json"' $PARALLEL
story_pipeline local-long "$LOCAL" 'schema = "story-long.schema.json"' $PARALLEL
RESULTS="$W/results.tsv"
run() { # run NAME ROUND [SYNTH [LABEL]]: a fresh output directory each time (nothing cached)
  local bin=${3:-$SYNTH} label=${4:-$1}
  rm -rf "${W:?}/$1"
  (cd "$W" && "$bin" run "$1.toml" > "$W/$label.$2.log" 2>&1)
  python3 - "$W/$1/manifest.json" "$label" "$2" >> "$RESULTS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["stages"]["answers"]["report"]
out, wall = r.get("tokens_out", 0), r["wall_seconds"]
print(f"{sys.argv[3]}\t{sys.argv[2]}\t{r.get('rows_out', 0)}\t{out}\t{wall:.2f}\t{out / wall:.1f}")
PY
  tail -1 "$RESULTS"
}
trap llama_cpp_server_stop EXIT
echo "machine: $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores, flags: $(grep -o -w 'avx2\|avx512f\|avx512vnni\|fma\|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "N=$N max_tokens=$MAX_TOKENS threads=$THREADS parallel=$PARALLEL rounds=$ROUNDS"
printf 'round\trun\tanswers\toutput_tokens\twall_s\ttokens_per_s\n' > "$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  for form in text schema long; do
    llama_cpp_server_start "$MODEL" 8767 "$THREADS" "$PARALLEL" 4096
    run "server-$form" "$round"
    llama_cpp_server_stop
    run "local-$form" "$round"
    if [ -n "${SYNTH_ALT:-}" ]; then run "local-$form" "$round" "$SYNTH_ALT" "alt-$form"; fi
  done
done
echo "== llama-batched-bench -npp 32 -ntg $MAX_TOKENS -npl $PARALLEL -t $THREADS"
"$LLAMA_CPP_DIR/bin/llama-batched-bench" -m "$MODEL" -c $((PARALLEL * (32 + MAX_TOKENS) + 256)) -b 2048 -ub 512 \
  -npp 32 -ntg "$MAX_TOKENS" -npl "$PARALLEL" -t "$THREADS" 2>/dev/null | grep -E '^\|' || true
python3 - "$RESULTS" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
alt = any(x["run"].startswith("alt-") for x in rows)
print("\n| round | form | llama-server tok/s (answers) | local tok/s (answers) | local ÷ server |" + (" SYNTH_ALT tok/s | ÷ server |" if alt else ""))
print("| ---: | --- | ---: | ---: | ---: |" + (" ---: | ---: |" if alt else ""))
for r in sorted({x["round"] for x in rows}):
    for form in ["text", "schema", "long"]:
        s = next(x for x in rows if x["round"] == r and x["run"] == f"server-{form}")
        l = next(x for x in rows if x["round"] == r and x["run"] == f"local-{form}")
        sv = float(s["tokens_per_s"])
        line = f"| {r} | {form} | {sv:.1f} ({s['answers']}) | {float(l['tokens_per_s']):.1f} ({l['answers']}) | {float(l['tokens_per_s']) / sv:.2f}× |"
        a = next((x for x in rows if x["round"] == r and x["run"] == f"alt-{form}"), None)
        if a:
            line += f" {float(a['tokens_per_s']):.1f} | {float(a['tokens_per_s']) / sv:.2f}× |"
        print(line)
PY
echo "raw: $RESULTS"

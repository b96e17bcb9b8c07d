#!/usr/bin/env bash
# Output tokens/s of the `local` provider (SmolLM2-135M-Instruct Q4_1 in-process, continuous
# batching) against llama-cpp-python[server] 0.3.36 serving the same GGUF (the `openai`
# provider, 16 requests in flight) on the same requests, one after the other on this machine:
# N prompts, 16 concurrent, with a JSON Schema (structured answers) and without. Each run
# starts from an empty output directory (nothing cached).
#   benches/local_vs_server.sh [N] [MAX_TOKENS] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/llama_server.sh
. benches/lib.sh
N=${1:-64}; MAX_TOKENS=${2:-128}; THREADS=${3:-2}
W=$(mktemp -d /tmp/local-vs-server-XXXX)
MODEL=$PWD/.tools/models/SmolLM2-135M-Instruct.Q4_1.gguf
.ci/setup-model
llama_server_install
cargo build --release --quiet
story_inputs "$N"
GEN="temperature = 0.8
max_tokens = $MAX_TOKENS
seed = 1"
LOCAL="kind = \"local\"
model = \"$MODEL\"
parallel = 16
threads = $THREADS
max_concurrency = 16
$GEN"
SERVER="kind = \"openai\"
base_url = \"http://127.0.0.1:8766/v1\"
model = \"smollm2\"
api_key_env = \"NO_KEY\"
structured_output = \"llama_cpp\"
max_concurrency = 16
initial_concurrency = 16
timeout_seconds = 3600
$GEN"
report() { # report NAME
  python3 - "$W/$1/manifest.json" "$W/time" "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); wall = float(open(sys.argv[2]).read().split()[0])
r = m["stages"]["answers"]["report"]
out = r.get("tokens_out", 0)
print(f"{sys.argv[3]:<24} wall {wall:7.1f} s  answers {r.get('rows_out', '?'):>4}  output tokens {out:>7}  {out / wall:7.1f} tokens/s")
PY
}
run() { # run NAME
  (cd "$W" && /usr/bin/time -f "%e" -o "$W/time" "$OLDPWD/target/release/synth" run "$1.toml" > "$W/$1.log" 2>&1)
  report "$1"
}
story_pipeline server-text "$SERVER" "" 16
story_pipeline server-schema "$SERVER" 'schema = "story.schema.json"' 16
story_pipeline local-text "$LOCAL" "" 16
story_pipeline local-schema "$LOCAL" 'schema = "story.schema.json"' 16
# The same local run with shared prompt starts off (the answers are the same bytes).
story_pipeline local-text-unshared "$LOCAL
share_prompts = false" "" 16
trap llama_server_stop EXIT
llama_server_start "$MODEL" 8766 "$THREADS" 4096
echo "machine: $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores; N=$N max_tokens=$MAX_TOKENS threads=$THREADS"
# Each local run right after the server's run of the same requests (the server idles while
# the local provider runs), so the VM's drift between pairs does not enter a ratio.
run server-text
run local-text
run server-schema
run local-schema
run local-text-unshared
llama_server_stop
cmp "$W/local-text/export.jsonl" "$W/local-text-unshared/export.jsonl" && echo "local-text and local-text-unshared: the same answers"
for r in local-text local-schema local-text-unshared; do
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["stages"]["answers"]["report"]["metrics"]; print(sys.argv[2], "prompt tokens", int(r["local_engine.prompt_tokens"]), "reused", int(r["local_engine.reused_prompt_tokens"]))' "$W/$r/manifest.json" "$r"
done

#!/usr/bin/env bash
# 40,000 requests through batch mode against the loopback fake batch server, synth and
# the openai Python SDK's batch flow side by side (same prompts, same server, same poll
# interval): client CPU (user+sys), peak RSS, and wall minus the server's simulated
# processing time (validating 0.02 s + --processing-ms). Installs the SDK into
# .tools/openai-sdk-venv on first use.
#   benches/batch_bench.sh [WORK_DIR]      (N=40000 PORT=18300 PROCESSING_MS=2000 POLL=0.2
#                                           ROUNDS=1 BEFORE=)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-40000}; PORT=${PORT:-18300}; PROCESSING_MS=${PROCESSING_MS:-2000}; POLL=${POLL:-0.2}
WORK=${1:-/tmp/synth-batch-bench}
VENV=.tools/openai-sdk-venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "openai==${OPENAI_SDK_VERSION:-3.57.0}"
fi
cargo build --release --locked
cargo bench --no-run --bench mock_batch 2>/dev/null
SERVER=$(ls -t target/release/deps/mock_batch-* | grep -v '\.d$' | head -1 || true)
rm -rf "$WORK"; mkdir -p "$WORK"; : > "$WORK/rounds.jsonl"
source benches/llm_project.sh
llm_project "$WORK" "$N" "kind = \"openai\"
base_url = \"http://127.0.0.1:$PORT/v1\"
model = \"bench-model\"
api_key_env = \"BENCH_KEY\"
batch = true
batch_poll_seconds = $POLL" "
[stages.export]
kind = \"jsonl\"
inputs = [\"answers\"]"
"$SERVER" --port "$PORT" --processing-ms "$PROCESSING_MS" --seconds 900 2>/dev/null &
SPID=$!
trap 'kill $SPID 2>/dev/null || true' EXIT
sleep 1
measure() { # label, command...
  local label=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/$label.time" "$@" > "$WORK/$label.out" 2> "$WORK/$label.err"
  read -r wall user sys rss < "$WORK/$label.time"
  python3 -c "w,u,s,r=$wall,$user,$sys,$rss; p=$PROCESSING_MS/1000+0.02; print('{\"client\": \"$label\", \"wall_s\": %.2f, \"wall_minus_processing_s\": %.2f, \"cpu_s\": %.2f, \"peak_rss_mib\": %.1f}' % (w, w-p, u+s, r/1024))"
}
# ROUNDS=N repeats the pair N times, interleaved (this VM drifts between minutes); with
# BEFORE=/path/to/an/older/synth that binary runs in each round too. Medians at the end.
for round in $(seq 1 "${ROUNDS:-1}"); do
  rm -rf "$WORK/out" "$WORK/sdk"
  (cd "$WORK" && BENCH_KEY=k measure synth "$ROOT/target/release/synth" run p.toml -q) | tee -a "$WORK/rounds.jsonl"
  wc -l < "$WORK/out/export.jsonl" | xargs -I{} echo "synth answered {} records"
  if [ -n "${BEFORE:-}" ]; then
    rm -rf "$WORK/out"
    (cd "$WORK" && BENCH_KEY=k measure synth_before "$BEFORE" run p.toml -q) | tee -a "$WORK/rounds.jsonl"
  fi
  measure openai_sdk "$VENV/bin/python" benches/batch_openai_sdk.py "http://127.0.0.1:$PORT/v1" "$N" "$WORK/sdk" "$POLL" \
    | tee -a "$WORK/rounds.jsonl"
  cat "$WORK/openai_sdk.out"
done
python3 - "$WORK/rounds.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for c in sorted({r["client"] for r in runs}):
    mine = [r for r in runs if r["client"] == c]
    med[c] = {k: statistics.median(r[k] for r in mine) for k in ("wall_minus_processing_s", "cpu_s", "peak_rss_mib")}
    print(json.dumps({"median_of": len(mine), "client": c, **med[c]}))
if "openai_sdk" in med and len(med) > 1:
    sdk = med["openai_sdk"]["wall_minus_processing_s"]
    print(json.dumps({c: round(m["wall_minus_processing_s"] / sdk, 2) for c, m in med.items()} | {"ratio_to": "openai_sdk, median wall - processing"}))
PY

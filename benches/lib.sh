#!/usr/bin/env bash
# Shared by the benchmark scripts (the sharded runs, the local-model comparisons); sourced, not
# run. They set W (a scratch folder) before calling these.

# measure NAME COMMAND...: run it under /usr/bin/time; print wall and CPU (user + sys) seconds,
# peak RSS, and the object-store traffic the run printed (if any). Stops the script on failure.
measure() {
  local name=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$W/time" "$@" > "$W/out.txt" 2> "$W/err.txt" \
    || { echo "$name FAILED"; cat "$W/err.txt"; exit 1; }
  local wall user sys rss traffic
  read -r wall user sys rss < "$W/time"
  traffic=$(grep -o 'object store traffic: .*' "$W/out.txt" || echo "-")
  printf '%-34s wall %7.1f s  cpu %7.1f s  peak RSS %5d MB  %s\n' "$name" "$wall" \
    "$(awk -v u="$user" -v s="$sys" 'BEGIN{print u+s}')" $((rss / 1024)) "$traffic"
}

# same BASE DIR: every output file of BASE (not _synth/, not the manifest) byte-identical in DIR.
same() {
  local base=$1 dir=$2 n=0 f
  for f in $(cd "$base" && find . -type f -not -path './_synth/*' -not -name manifest.json | sort); do
    cmp -s "$base/$f" "$dir/$f" || { echo "DIFFERS: $dir/$f"; exit 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no outputs in $base"; exit 1; }
  echo "  $n outputs byte-identical to the one-process run"
}

# wait_http URL NAME LOG: wait up to 120 s until URL answers; else print LOG's end and fail.
wait_http() {
  local url=$1 name=$2 log=$3
  for _ in $(seq 1 120); do
    if curl -sf "$url" >/dev/null; then return 0; fi
    sleep 1
  done
  echo "$name did not start:"; tail -20 "$log"; return 1
}

# story_inputs N: W/records.jsonl (N short-story topics), W/story.schema.json,
# W/story-long.schema.json (a string no answer finishes) and W/prompt.j2,
# the requests of the local-model comparisons (local_vs_server.sh, local_vs_llama_cpp.sh).
story_inputs() {
  python3 - "$W" "$1" <<'PY'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
topics = ["a lighthouse", "bread", "winter", "a cat", "trains", "the moon", "rain", "a library", "mountains",
          "coffee", "a garden", "snow", "music", "a bridge", "autumn", "the sea"]
with open(f"{w}/records.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"topic": f"{topics[i % len(topics)]} (story {i})"}) + "\n")
schema = {"type": "object", "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
          "required": ["title", "text"], "additionalProperties": False}
json.dump(schema, open(f"{w}/story.schema.json", "w"))
# One string longer than any max_tokens the benches use: every answer is max_tokens of JSON.
long = {"type": "object", "properties": {"text": {"type": "string", "minLength": 1000}},
        "required": ["text"], "additionalProperties": False}
json.dump(long, open(f"{w}/story-long.schema.json", "w"))
open(f"{w}/prompt.j2", "w").write("Write a short story about {{ topic }}.\n")
PY
}

# story_pipeline NAME PROVIDER_TABLE SCHEMA_LINE CONCURRENCY: W/NAME.toml, the story records
# answered by provider `m` (one try each), written as JSONL.
story_pipeline() {
  cat > "$W/$1.toml" <<TOML
[pipeline]
name = "$1"
output_dir = "$1"
[providers.m]
$2
[stages.records]
kind = "source"
path = "records.jsonl"
[stages.answers]
kind = "llm"
inputs = ["records"]
provider = "m"
prompt = "prompt.j2"
max_attempts = 1
max_failure_ratio = 1.0
concurrency = $4
$3
[stages.export]
kind = "jsonl"
inputs = ["answers"]
TOML
}

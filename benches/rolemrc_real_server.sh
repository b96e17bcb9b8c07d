#!/usr/bin/env bash
# RoleMRC's demo profile (`--profile demo`: an OpenAI-compatible endpoint from the
# environment) against a real server with a real small model: llama-cpp-python[server]
# 0.3.36 serving SmolLM2-135M-Instruct (Q4_1 GGUF, .ci/setup-model) on 127.0.0.1, small
# counts, with the structured answers on (the stages' JSON Schemas: llama-cpp-python refuses
# OpenAI's json_schema with a 500, so synth moves to its json_object + schema form) and off
# (the paper's text protocol). Prints, per LLM stage, the records and the answers accepted
# first time / after a re-ask / never, from each run's manifest.
#   benches/rolemrc_real_server.sh [PERSONAS]
# COUNTS / TEST in the environment replace the plan's counts and test split (the --set values).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
. benches/llama_server.sh
PERSONAS=${1:-4}
W=$(mktemp -d /tmp/rolemrc-real-XXXX)
MODEL=.tools/models/SmolLM2-135M-Instruct.Q4_1.gguf
.ci/setup-model
llama_server_install
cargo build --release --quiet
trap llama_server_stop EXIT
llama_server_start "$MODEL" 8765 2 8192
export OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=none SYNTH_MODEL=smollm2-135m
COUNTS=${COUNTS:-'stages.plan.counts={free_chat=1,onscene_chat=1,answer=1,no_answer=1,refusal=1,attempt=1,multi_turn=1,nested=1,prioritized=1}'}
TEST=${TEST:-'stages.plan.test={per_task=1,nested_content=[1,1],nested_format=[1,1],prioritized=[1,1]}'}
OFF=()
for s in profiles_llm free_chats onscene_chats stylized rewritten; do OFF+=(--set "stages.$s.structured=\"off\""); done
# With the schema on, the grammar-decoder schemas and failure allowances of the local profile
# (llama.cpp's server turns a schema into a grammar too): alternating non-empty dialogue turns,
# non-empty answers, spares for failed samples.
ON=(--set 'stages.free_chats.schema="pipelines/prompts/rolemrc/dialogue.local.schema.json"'
    --set 'stages.onscene_chats.schema="pipelines/prompts/rolemrc/dialogue.local.schema.json"'
    --set 'stages.stylized.schema="pipelines/prompts/rolemrc/stylized.local.schema.json"'
    --set 'stages.rewritten.schema="pipelines/prompts/rolemrc/stylized.local.schema.json"')
ALLOW=(--set 'stages.free_chats.max_attempts=5' --set 'stages.free_chats.max_failure_ratio=0.6'
       --set 'stages.onscene_chats.max_attempts=5' --set 'stages.onscene_chats.max_failure_ratio=0.6'
       --set 'stages.samples.max_failure_ratio=0.5')
for mode in on off; do
  extra=("${ALLOW[@]}")
  [ "$mode" = on ] && extra+=("${ON[@]}")
  [ "$mode" = off ] && extra+=("${OFF[@]}")
  /usr/bin/time -f "%e" -o "$W/time" target/release/synth run pipelines/rolemrc.toml --profile demo \
    --out "$W/$mode" --set "stages.personas.n=$PERSONAS" --set "$COUNTS" --set "$TEST" \
    --set 'providers.gpt4o.max_tokens=1280' --set 'providers.gpt4o.max_concurrency=1' \
    --set 'providers.gpt4o.timeout_seconds=600' "${extra[@]}" > "$W/$mode.log" 2>&1 || true
  echo "== schema $mode: $(cat "$W/time") s wall ($W/$mode)"
  python3 - "$W/$mode/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(f"{'stage':<15}{'records':>8}{'first':>7}{'re-asked':>9}{'failed':>7}  structured")
for name, st in m["stages"].items():
    if st.get("status") == "failed":
        print(f"{name:<15} failed, the run stopped: {(st.get('error') or '')[:160]}")
        continue
    r = st.get("report") or {}
    met = r.get("metrics") or {}
    if "answers.first_attempt" not in met:
        continue
    info = r.get("info", {})
    print(f"{name:<15}{r.get('rows_in', 0):>8}{met['answers.first_attempt']:>7.0f}{met['answers.after_reask']:>9.0f}"
          f"{met['answers.failed']:>7.0f}  {info.get('structured', '-')}  {r.get('requests', 0)} requests, {r.get('wall_seconds', 0):.0f} s")
PY
done

#!/usr/bin/env bash
# Sourced, not run, by the LLM-stage benchmarks (batch_bench.sh, rate_under_disk_pressure.sh):
# writes the project they share into DIR: N records, a one-line prompt, and p.toml with a
# records → llm stage pipeline on provider "api".
#
#   llm_project DIR N PROVIDER_LINES [EXTRA_TOML]
# PROVIDER_LINES: the [providers.api] table's lines (kind, base_url, model, ...).
# EXTRA_TOML: appended after the llm stage (more stages).
llm_project() {
  local dir=$1 n=$2 provider=$3 extra=${4:-}
  python3 - "$dir" "$n" <<'PY'
import sys
work, n = sys.argv[1], int(sys.argv[2])
with open(f"{work}/records.jsonl", "w") as f:
    for i in range(n):
        f.write('{"name": "item %d", "topic": "topic %d"}\n' % (i, i % 7))
PY
  printf 'Record {{ id }}: write one sentence about {{ name }} and {{ topic }}.\n' > "$dir/prompt.j2"
  cat > "$dir/p.toml" <<TOML
[pipeline]
name = "llm-bench"
output_dir = "out"

[providers.api]
$provider

[stages.records]
kind = "source"
path = "records.jsonl"

[stages.answers]
kind = "llm"
inputs = ["records"]
provider = "api"
prompt = "prompt.j2"
$extra
TOML
}

#!/usr/bin/env bash
# Paper-scale offline RoleMRC run (BENCHMARKS.md): 10.5k personas, 808.7k MRC records,
# Table 2 counts, the offline provider and hashing embedder. Make the data first:
#   python3 pipelines/data/rolemrc-demo/generate.py --personas 10500 --records 808700 --mix 0 --out /tmp/rolemrc-scale
# then: /usr/bin/time -v benches/rolemrc_scale.sh /tmp/rolemrc-scale   (SYNTH=path picks another binary;
# OUT=dir another output directory; arguments after the data directory go to `synth run`)
set -euo pipefail
D=${1:-/tmp/rolemrc-scale}
shift || true
cd "$(dirname "$0")/.."
exec "${SYNTH:-target/release/synth}" run pipelines/rolemrc.toml --offline --out "${OUT:-$D/out}" -q "$@" \
  --set "stages.personas_raw.path=\"$D/personas.jsonl\"" \
  --set "stages.msmarco.path=\"$D/msmarco.jsonl\"" \
  --set stages.personas.n=10500 \
  --set 'stages.plan.counts={free_chat=5000, onscene_chat=5000, answer=2000, no_answer=2000, refusal=2000, attempt=2000, multi_turn=2000, nested=1600, prioritized=2400}' \
  --set 'stages.plan.test={per_task=100, nested_content=[20, 22], nested_format=[58, 58], prioritized=[22, 20]}'

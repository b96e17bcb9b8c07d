#!/usr/bin/env bash
# The `--set`s that run the RoleMRC pipeline without its quality control (BENCHMARKS.md,
# "Quality control at paper scale"): no content checks on the five LLM stages, and the four
# near-duplicate stages replaced by pass-through maps. Prints one argument per line:
#   mapfile -t OFF < <(benches/quality_off.sh); benches/rolemrc_scale.sh /tmp/rolemrc-scale "${OFF[@]}"
for s in profiles_llm free_chats onscene_chats stylized rewritten; do
  printf -- '--set\nstages.%s.checks={}\n' "$s"
done
for pair in profiles_unique:profiles_llm free_chats_unique:free_chats onscene_chats_unique:onscene_chats stylized_unique:stylized; do
  printf -- '--set\nstages.%s={kind="map", inputs=["%s"]}\n' "${pair%%:*}" "${pair##*:}"
done

#!/usr/bin/env bash
# The content checks' cost at paper scale (BENCHMARKS.md, "The checks' cost at paper scale"):
# the RoleMRC offline run with its checks (on) and without (off: `checks={}` on the five LLM
# stages), alternating, fresh output directories. The near-duplicate stages run in both, so both
# runs do the same downstream work; their own cost is their stages' wall, printed per run.
#   benches/quality_ab.sh /tmp/rolemrc-scale on off on off      (data from generate.py, see rolemrc_scale.sh)
set -euo pipefail
D=${1:-/tmp/rolemrc-scale}
shift || true
cd "$(dirname "$0")/.."
OFF=()
for s in profiles_llm free_chats onscene_chats stylized rewritten; do OFF+=(--set "stages.$s.checks={}"); done
# The generator's personas repeat (2,699 distinct of 10,500): more than the stage's default
# failure ratio are near-duplicates.
COMMON=(--set stages.profiles_unique.max_failure_ratio=1.0)
for v in "$@"; do
  out=${TMPDIR:-/tmp}/quality-ab-$v
  rm -rf "$out"
  if [ "$v" = on ]; then A=("${COMMON[@]}"); else A=("${COMMON[@]}" "${OFF[@]}"); fi
  OUT=$out /usr/bin/time -f "$v: wall %e s, user %U s, sys %S s, peak RSS %M KB" benches/rolemrc_scale.sh "$D" "${A[@]}"
  python3 - "$out/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
checks = dedup = 0.0
parts = []
for name, s in m["stages"].items():
    r = s.get("report") or {}
    c = r.get("metrics", {}).get("checks.seconds")
    if c:
        checks += c
        parts.append(f"{name} {r['wall_seconds']:.1f} s (checks {c:.1f})")
    if s["kind"] == "dedup":
        dedup += r["wall_seconds"]
        parts.append(f"{name} {r['wall_seconds']:.2f} s {r['rows_in']}->{r['rows_out']}")
    if name in ("sft", "dpo", "test"):
        parts.append(f"{name} {r['rows_out']} rows")
print(f"  sum checks.seconds {checks:.1f}, dedup stages wall {dedup:.2f} s; " + "; ".join(parts))
PY
done

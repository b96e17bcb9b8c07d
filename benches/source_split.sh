#!/usr/bin/env bash
# A source split among shards (BENCHMARKS.md, "Sharded runs": source reads): one large
# JSONL file (RECORDS records, default 1,000,000, ~300 MB; no id column, so ids are
# ordinals; every 1000th line is bad JSON, so failures carry line numbers; every part
# sees every column's type, so the merge decodes no part again), read
#   - in one process (the baseline);
#   - with --shards N --executor local, the source split in N parts (its default from
#     64 MiB on);
#   - with --shards 2 and `shard = false` on the source: read once, as before the split.
# For each: wall and CPU seconds and peak RSS (/usr/bin/time), and a byte comparison of
# the output and failure table with the one-process run.
#   benches/source_split.sh [RECORDS] [SHARD COUNTS...]     (SYNTH=path picks another binary)
set -euo pipefail
records=${1:-1000000}
shift || true
counts=("${@:-2 4}")
cd "$(dirname "$0")/.."
synth=${SYNTH:-$PWD/target/release/synth}
W=$(mktemp -d /tmp/synth-source-bench.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
python3 - "$records" > "$W/notes.jsonl" <<'PY'
import json, sys
n = int(sys.argv[1])
words = "tea river stone lamp violin salt copper moss kite ember harbor lantern".split()
out = sys.stdout
for i in range(n):
    if i % 1000 == 999:
        out.write('{"text": "broken",\n')
        continue
    text = " ".join(words[(i * k + k * k) % 12] for k in range(1, 30))
    rec = {"text": text, "n": i, "score": i / 7, "tags": [words[i % 12], words[i % 5]],
           "extra": None if i % 3 == 0 else f"x{i}"}
    out.write(json.dumps(rec) + "\n")
PY
cat > "$W/p.toml" <<TOML
[pipeline]
name = "source-split"
output_dir = "out"

[stages.notes]
kind = "source"
path = "$W/notes.jsonl"
max_failure_ratio = 0.01

[stages.export]
kind = "parquet"
inputs = ["notes"]
TOML
echo "data: $(du -m "$W/notes.jsonl" | cut -f1) MB, $records lines"
measure() {
  local name=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$W/time" "$synth" run "$W/p.toml" -q "$@" > "$W/out.txt" 2> "$W/err.txt" \
    || { echo "$name FAILED"; cat "$W/err.txt"; exit 1; }
  read -r wall user sys rss < "$W/time"
  printf '%-34s wall %6.1f s  cpu %6.1f s  peak RSS %5d MB\n' "$name" "$wall" "$(awk -v u="$user" -v s="$sys" 'BEGIN{print u+s}')" $((rss / 1024))
}
same() {
  for f in notes.parquet notes.failures.parquet; do
    cmp -s "$W/base/$f" "$1/$f" || { echo "DIFFERS: $1/$f"; exit 1; }
  done
  echo "  output and failures byte-identical to the one-process run"
}
measure "one process" --out "$W/base"
for n in ${counts[*]}; do
  measure "--shards $n, source split" --out "$W/split-$n" --shards "$n" --executor local
  same "$W/split-$n"
done
measure "--shards 2, source read once" --out "$W/once" --shards 2 --executor local --set stages.notes.shard=false
same "$W/once"

#!/usr/bin/env bash
# A source split among shards (BENCHMARKS.md, "Sharded runs": source reads): one large
# JSONL file (RECORDS records, default 1,000,000, ~300 MB; no id column, so ids are
# ordinals; every 1000th line is bad JSON, so failures carry line numbers; every part
# sees every column's type, so the merge decodes no part again), read
#   - in one process (the baseline);
#   - with --shards N --executor local, the source split in N parts (`shard = true`: at any
#     RECORDS; its default from 64 MiB on);
#   - with --shards 2 and `shard = false` on the source: read once, as before the split.
# For each: wall and CPU seconds and peak RSS (/usr/bin/time, benches/lib.sh), and a byte comparison of
# every output (the source's, its failure table, the export) with the one-process run.
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
source benches/lib.sh
measure "one process" "$synth" run "$W/p.toml" -q --out "$W/base"
for n in ${counts[*]}; do
  measure "--shards $n, source split" "$synth" run "$W/p.toml" -q --out "$W/split-$n" --shards "$n" --executor local --set stages.notes.shard=true
  same "$W/base" "$W/split-$n"
done
measure "--shards 2, source read once" "$synth" run "$W/p.toml" -q --out "$W/once" --shards 2 --executor local --set stages.notes.shard=false
same "$W/base" "$W/once"

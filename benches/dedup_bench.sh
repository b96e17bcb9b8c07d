#!/usr/bin/env bash
# Near-duplicate removal over 100k dialogues (BENCHMARKS.md, "Near-duplicate removal"): synth's
# `dedup` stage and datatrove's MinHash pipeline on the same JSONL, one after the other, with the
# same shingles (word 5-grams) and LSH (14 bands × 8 hashes), wall time and peak RSS of each.
#   benches/dedup_bench.sh [N] [DIR]     (datatrove from PyPI in DIR/venv; SYNTH=path picks a binary)
set -euo pipefail
N=${1:-100000}
W=${2:-/tmp/dedup}
cd "$(dirname "$0")/.."
. benches/lib.sh
mkdir -p "$W"
if [ ! -x "$W/venv/bin/python" ]; then
  python3 -m venv "$W/venv" && "$W/venv/bin/pip" install -q "datatrove[processing]==0.10.1" "orjson==3.11.5" "spacy==3.8.7"
fi
[ -f "$W/dialogues.jsonl" ] || python3 benches/dedup_data.py --dialogues "$N" --out "$W/dialogues.jsonl"
cat > "$W/dedup.toml" <<TOML
[pipeline]
name = "dedup-bench"
max_failure_ratio = 1.0

[stages.dialogues]
kind = "source"
path = "$W/dialogues.jsonl"

[stages.unique]
kind = "dedup"
inputs = ["dialogues"]
fields = ["turns[].content"]
threshold = 0.8
TOML
rm -rf "$W/synth-out" "$W/dt"
# The source stage's JSONL read is timed apart (--until dialogues), then the whole run: the dedup
# stage's own seconds are in its report (synth stats).
measure "synth source only" "${SYNTH:-target/release/synth}" run "$W/dedup.toml" --out "$W/synth-out" -q --until dialogues
measure "synth dedup (source up to date)" "${SYNTH:-target/release/synth}" run "$W/dedup.toml" --out "$W/synth-out" -q
"${SYNTH:-target/release/synth}" stats "$W/synth-out" | grep -E "unique|dialogues"
python3 - "$W/synth-out/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["stages"]["unique"]["report"]
print(f"synth: checked {m['metrics']['dedup.checked']:.0f}, removed {m['metrics']['dedup.removed']:.0f}, stage wall {m['wall_seconds']:.2f} s")
PY
# datatrove reads a file per task: the same lines in two files, one per worker (not timed).
rm -rf "$W/parts" && mkdir -p "$W/parts"
half=$(( ($(wc -l < "$W/dialogues.jsonl") + 1) / 2 ))
split -l "$half" -d --additional-suffix=.jsonl "$W/dialogues.jsonl" "$W/parts/part-"
measure "datatrove minhash (4 steps)" "$W/venv/bin/python" benches/dedup_datatrove.py "$W/parts" "$W/dt" 2
python3 - "$W/dt" <<'PY'
import glob, gzip, json, sys
def count(p):
    n = 0
    for f in glob.glob(p):
        with gzip.open(f, "rt") as fh:
            n += sum(1 for _ in fh)
    return n
print(f"datatrove: kept {count(sys.argv[1] + '/kept/*.jsonl.gz')}, removed {count(sys.argv[1] + '/removed/*.jsonl.gz')}")
PY

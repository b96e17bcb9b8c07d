#!/usr/bin/env bash
# sharp_claims over a generated 34M-line gzip ConceptNet dump (the official 5-column layout), side
# by side with the obvious pandas and csv-module readers doing the same filtering (BENCHMARKS.md).
# Installs pandas into .tools/sharpbenchvenv (PyPI) on first use. Writes the dump to $DIR (default
# /tmp/sharp-bench, ~10 GB uncompressed, ~1.5 GB on disk) unless it is there already.
#   benches/sharp_claims.sh [DIR] [LINES]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/sharp-bench}
LINES=${2:-34074917}
PANDAS=pandas==3.1.1
mkdir -p "$DIR"
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
cargo build --release --locked --bin synth
SYNTH=$PWD/target/release/synth
DUMP=$DIR/assertions-$LINES.csv.gz
if [ ! -f "$DUMP" ]; then
  cargo bench --locked --bench conceptnet_dump -- --lines "$LINES" --out "$DUMP.part"
  mv "$DUMP.part" "$DUMP"
fi
venv=.tools/sharpbenchvenv
if [ "$(cat $venv/PACKAGES 2>/dev/null)" != "$PANDAS" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "$PANDAS"
  echo "$PANDAS" > "$venv/PACKAGES"
fi
ls -l "$DUMP"
measure() { # name, command...: wall seconds, peak RSS (KiB), CPU seconds from GNU time
  local name=$1; shift
  /usr/bin/time -f "$name wall=%e rss_kib=%M user=%U sys=%S" -o "$DIR/$name.time" "$@" > "$DIR/$name.out" 2> "$DIR/$name.err" \
    || { echo "$name failed:"; tail -5 "$DIR/$name.err"; return 1; }
  cat "$DIR/$name.time"
}
for check in all kept; do
  cat > "$DIR/claims-$check.toml" <<TOML
[pipeline]
name = "sharp-bench"
seed = 7
root = "$PWD"

[stages.claims]
kind = "sharp_claims"
path = "$DUMP"
sample = 1000
check_json = "$check"
TOML
  rm -rf "$DIR/out-$check"
  measure "synth-check-$check" "$SYNTH" run "$DIR/claims-$check.toml" --out "$DIR/out-$check" -q
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['stages']['claims']['report']; print('  rows', r['rows_in'], 'claims', r['rows_out'], 'distinct', r['metrics']['distinct_claims'], 'rows/s', round(r['rows_in']/r['wall_seconds']))" "$DIR/out-$check/manifest.json"
done
measure pandas "$venv/bin/python" benches/sharp_claims_python.py "$DUMP" --engine pandas && cat "$DIR/pandas.out"
measure csv "$venv/bin/python" benches/sharp_claims_python.py "$DUMP" --engine csv && cat "$DIR/csv.out"

#!/usr/bin/env bash
# `synth view` on a paper-scale stage output (BENCHMARKS.md, "synth view"): the table
# endpoint's time for the first page, page 1,000, a page near the end, sorted and filtered
# pages, and the server's peak RSS while browsing, at 100,000 and 808,700 rows (is memory
# independent of the file's size?). Peer, on the same file: pyarrow (26.0.1, in
# .tools/viewbenchvenv) reading page 1,000 the two usual ways: the whole table then a slice
# (what a notebook or a pandas-based viewer does), and only the row group holding it; and
# pyarrow counting one column's values / lengths (the facets' peer).
#   benches/view_bench.sh [WORKDIR]        (needs target/release/synth)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-/tmp/synth-view-bench}
SYNTH=${SYNTH:-target/release/synth}
PACKAGES="pyarrow==26.0.1"
venv=.tools/viewbenchvenv
if [ "$(cat "$venv/PACKAGES" 2>/dev/null)" != "$PACKAGES" ]; then
  python=$(command -v python3 || command -v python)
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet $PACKAGES
  echo "$PACKAGES" > "$venv/PACKAGES"
fi
for rows in 100000 808700; do
  mkdir -p "$W/$rows"
  # The first call writes the file; the second, a fresh process, measures browsing it.
  "$SYNTH" -q bench view --rows "$rows" --dir "$W/$rows" > /dev/null
  echo "== synth bench view --rows $rows"
  "$SYNTH" -q bench view --rows "$rows" --dir "$W/$rows"
  for how in whole rowgroup; do
    echo "== pyarrow ($how) page 1,000 of $rows rows"
    "$venv/bin/python" - "$W/$rows/samples.parquet" "$how" <<'PY'
import json, resource, sys, time
import pyarrow.parquet as pq
path, how = sys.argv[1], sys.argv[2]
offset, limit = 49950, 50
t = time.perf_counter()
if how == "whole":
    rows = pq.read_table(path).slice(offset, limit).to_pylist()
else:
    f = pq.ParquetFile(path)
    start = 0
    for rg in range(f.num_row_groups):
        n = f.metadata.row_group(rg).num_rows
        if offset < start + n:
            break
        start += n
    rows = f.read_row_group(rg).slice(offset - start, limit).to_pylist()
ms = (time.perf_counter() - t) * 1000
print(json.dumps({"peer": "pyarrow-" + how, "page_1000_ms": round(ms, 1), "rows": len(rows),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
PY
  done
  # The peer of a facet: pyarrow reading one column and counting its values (category),
  # bucketing its numbers (reply_words), or its list lengths (conversations), fresh each.
  echo "== pyarrow facets of $rows rows"
  "$venv/bin/python" - "$W/$rows/samples.parquet" <<'PY'
import json, sys, time
import pyarrow.compute as pc
import pyarrow.parquet as pq
path = sys.argv[1]
out = {"peer": "pyarrow-facets"}
for column in ["category", "reply_words", "conversations", "id"]:
    t = time.perf_counter()
    col = pq.read_table(path, columns=[column]).column(0)
    if column == "category":
        pc.value_counts(col)
    elif column == "reply_words":
        lo, hi = pc.min_max(col).values()
        pc.value_counts(pc.floor(pc.divide(pc.subtract(col, lo), (hi.as_py() - lo.as_py()) / 12 or 1)))
    elif column == "conversations":
        pc.value_counts(pc.list_value_length(col))
    else:
        pc.value_counts(pc.utf8_length(col))
    out["facets_" + column + "_ms"] = round((time.perf_counter() - t) * 1000, 1)
print(json.dumps(out))
PY
done

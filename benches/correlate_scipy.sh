#!/usr/bin/env bash
# The `correlate` kind on 1,000,000 generated pairs against scipy.stats on the same data
# (BENCHMARKS.md, "CharacterBench"): Pearson, Spearman, Kendall tau-b with p-values, on
# continuous pairs and on heavily tied 1..5 scores; equal values, and the time ratio.
#   benches/correlate_scipy.sh [N] [WORKDIR]
# synth: each correlate stage run alone (`--only`), the whole process; scipy: the three calls
# per pair set, its CSV read excluded. Best of REPEAT (3), wall and CPU time: on a shared,
# loaded machine the CPU times are the steadier comparison. Needs target/release/synth.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
W=${2:-/tmp/synth-correlate-bench}
SYNTH=${SYNTH:-target/release/synth}
py=$(benches/scipy_setup.sh)
mkdir -p "$W"
[ -f "$W/pairs.csv" ] && [ "$(($(wc -l < "$W/pairs.csv") - 1))" = "$N" ] || "$py" benches/correlate_scipy.py gen "$W" "$N"
cat > "$W/p.toml" <<TOML
[pipeline]
name = "correlate-bench"
seed = 1

[stages.pairs]
kind = "source"
path = "pairs.csv"
types = { x = "float64", y = "float64", xt = "float64", yt = "float64" }

[stages.cont]
kind = "correlate"
inputs = ["pairs"]
x = ["x"]
y = "y"

[stages.tied]
kind = "correlate"
inputs = ["pairs"]
x = ["xt"]
y = "yt"

[stages.report]
kind = "report"
inputs = ["cont", "tied"]
charts = []
TOML
rm -rf "$W/out"
(cd "$W" && "$OLDPWD/$SYNTH" run p.toml --out out -q >/dev/null)
# Each correlate stage alone, best of $REPEAT: the whole process (start-up, the Parquet read
# of its input, the three coefficients with p-values, the outputs), wall and CPU (user+sys).
REPEAT=${REPEAT:-3}
for stage in cont tied; do
  best=""
  for _ in $(seq "$REPEAT"); do
    t=$( { (cd "$W" && /usr/bin/time -f "%e %U %S" "$OLDPWD/$SYNTH" run p.toml --out out --only "$stage" --force -q >/dev/null) ; } 2>&1 | tail -1)
    best=$(printf '%s\n%s\n' "$best" "$t" | awk 'NF==3 {w=$1; c=$2+$3; if (bw=="" || w<bw) bw=w; if (bc=="" || c<bc) bc=c} END {printf "%.3f %.3f", bw, bc}')
  done
  echo "{\"synth_$stage\": {\"wall_s\": ${best% *}, \"cpu_s\": ${best#* }}}"
done
"$SYNTH" inspect "$W/out/cont.parquet" --json --rows 10 > "$W/synth-cont.jsonl"
"$SYNTH" inspect "$W/out/tied.parquet" --json --rows 10 > "$W/synth-tied.jsonl"
"$py" benches/correlate_scipy.py scipy "$W"
"$py" benches/correlate_scipy.py compare "$W"

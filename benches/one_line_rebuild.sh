#!/usr/bin/env bash
# benches/one_line_rebuild.sh SRC TARGET_DIR ROUNDS FILE...: how long a release build of the
# binary takes after a one-line change to FILE (a comment appended), for each FILE in turn,
# ROUNDS times. SRC is a git checkout, TARGET_DIR its built target directory; FILEs are
# relative to SRC. Each change is reverted with `git checkout` and rebuilt (untimed) before
# the next, so every timed build sees exactly one change.
set -euo pipefail
src=$1; export CARGO_TARGET_DIR=$(realpath "$2"); rounds=$3; shift 3
cd "$src"
build() { cargo build --release --locked --bin synth >/dev/null 2>&1; }
build
for round in $(seq 1 "$rounds"); do
  for f in "$@"; do
    echo '// one-line change' >> "$f"
    s=$(date +%s.%N)
    build || { git checkout -q -- "$f"; echo "build failed after changing $f" >&2; exit 1; }
    e=$(date +%s.%N)
    git checkout -q -- "$f"
    echo "round $round $f $(echo "$e - $s" | bc) s"
    build
  done
done

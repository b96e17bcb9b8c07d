#!/usr/bin/env bash
# benches/offline_outputs.sh BIN [LIST]: run every shipped pipeline that runs offline, with the
# synth binary BIN, in a scratch copy of the repository's tracked files (chained pipelines in the
# order they read each other), and print one line per output file: its SHA-256 and its path
# under outputs/ (not _synth/, not manifest.json, whose times differ). Two binaries (say, the
# commits before and after a refactoring such as the workspace move) give the same files when
# `diff` of their lists is empty. LIST: write the list there too.
set -euo pipefail
bin=$(realpath "$1"); list=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/offline-outputs-XXXX)
trap 'rm -rf "$W"' EXIT
mkdir "$W/repo"
git -C "$repo" archive HEAD pipelines seeds rules outputs | tar -x -C "$W/repo"
# The pipelines that read the shared sample data name it as ../shared beside the repository.
[ -d "$repo/../shared" ] && ln -s "$(cd "$repo/../shared" && pwd)" "$W/shared"
cd "$W/repo"
# Each with its own offline profile (`--offline`); the ones that read another's outputs after it.
pipelines=(
  rolemrc rolemrc-judge rolemrc-eval rolemrc-compare
  characterbench-build characterbench characterbench-compare
  roleeval-build roleeval rolebench-eval
  sharp starter
)
for p in "${pipelines[@]}"; do
  if ! "$bin" run "pipelines/$p.toml" --offline > "$W/$p.log" 2>&1; then
    echo "pipelines/$p.toml --offline FAILED:" >&2
    tail -n 20 "$W/$p.log" >&2
    exit 1
  fi
done
out=$(find outputs -mindepth 2 -type f ! -path '*/_synth/*' ! -name manifest.json -print0 | sort -z | xargs -0 sha256sum)
printf '%s\n' "$out" | tee ${list:+"$list"}
echo "$(printf '%s\n' "$out" | wc -l) files from ${#pipelines[@]} pipelines" >&2

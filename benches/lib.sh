#!/usr/bin/env bash
# Shared by the sharded-run benchmarks (shard_scale.sh, source_split.sh); sourced, not run.
# They set W (a scratch folder) before calling these.

# measure NAME COMMAND...: run it under /usr/bin/time; print wall and CPU (user + sys) seconds,
# peak RSS, and the object-store traffic the run printed (if any). Stops the script on failure.
measure() {
  local name=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$W/time" "$@" > "$W/out.txt" 2> "$W/err.txt" \
    || { echo "$name FAILED"; cat "$W/err.txt"; exit 1; }
  local wall user sys rss traffic
  read -r wall user sys rss < "$W/time"
  traffic=$(grep -o 'object store traffic: .*' "$W/out.txt" || echo "-")
  printf '%-34s wall %7.1f s  cpu %7.1f s  peak RSS %5d MB  %s\n' "$name" "$wall" \
    "$(awk -v u="$user" -v s="$sys" 'BEGIN{print u+s}')" $((rss / 1024)) "$traffic"
}

# same BASE DIR: every output file of BASE (not _synth/, not the manifest) byte-identical in DIR.
same() {
  local base=$1 dir=$2 n=0 f
  for f in $(cd "$base" && find . -type f -not -path './_synth/*' -not -name manifest.json | sort); do
    cmp -s "$base/$f" "$dir/$f" || { echo "DIFFERS: $dir/$f"; exit 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no outputs in $base"; exit 1; }
  echo "  $n outputs byte-identical to the one-process run"
}

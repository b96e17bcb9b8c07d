#!/usr/bin/env bash
# benches/crate_cpu.sh SRC TARGET_DIR [LOG]: the CPU time of each of synth's own crates in a
# release build of the binary. SRC is a checkout (any commit: the one crate before the
# workspace move too), TARGET_DIR a target directory where that checkout's dependencies are
# already built (say, the one a cold build left). Every `.rs` file under SRC/src is touched,
# so only synth's crates compile again; each rustc of a workspace crate runs under
# /usr/bin/time (cargo's RUSTC_WORKSPACE_WRAPPER, this script again), and one line per crate
# gives user + system seconds, then the sum and the build's wall time. LOG keeps the lines.
# The lines add up what every thread of a crate's rustc used, so crates built side by side
# are measured as they would be alone (give or take cache contention).
# CRATE_CPU_CI=1: CI's test build instead (`cargo test --release --locked --no-run`, each
# crate through SRC's .ci/clippy-rustc, which lints and then builds).
set -euo pipefail
if [ -n "${CRATE_CPU_LOG:-}" ]; then
  # Wrapper mode: cargo calls `$0 RUSTC ARGS...`.
  name=unknown prev=
  for a in "$@"; do [ "$prev" = --crate-name ] && name=$a; prev=$a; done
  kind=lib
  case " $* " in *" --test "*) kind=test ;; *"--crate-type bin"*) kind=bin ;; esac
  exec /usr/bin/time -f "$name $kind %U %S" -a -o "$CRATE_CPU_LOG" ${CRATE_CPU_INNER:+"$CRATE_CPU_INNER"} "$@"
fi
self=$(realpath "$0"); src=$(realpath "$1"); target=$(realpath "$2"); log=${3:-$(mktemp /tmp/crate-cpu-XXXX.log)}
: > "$log"
find "$src/src" -name '*.rs' -exec touch {} +
inner= cmd=(cargo build --release --locked --bin synth)
if [ -n "${CRATE_CPU_CI:-}" ]; then inner=$src/.ci/clippy-rustc; cmd=(cargo test --release --locked --no-run); fi
start=$(date +%s.%N)
(cd "$src" && CARGO_TARGET_DIR=$target CRATE_CPU_LOG=$log CRATE_CPU_INNER=$inner \
  RUSTC_WORKSPACE_WRAPPER=$self "${cmd[@]}" >"$log.build" 2>&1) || { tail -n 20 "$log.build" >&2; echo "the build failed" >&2; exit 1; }
rm -f "$log.build"
end=$(date +%s.%N)
# Build scripts and cargo's probes (crate names `build_script_build`, `___`) are left out.
grep -v -e '^___ ' -e '^build_script' -e '^unknown ' "$log" | sort -k3 -g -r \
  | awk '{ t = $3 + $4; sum += t; printf "%-24s %-5s %8.2f s\n", $1, $2, t }
         END { printf "%-30s %8.2f s\n", "all of synth'"'"'s crates", sum }'
echo "wall $(echo "$end - $start" | bc) s"

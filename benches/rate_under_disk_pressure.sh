#!/usr/bin/env bash
# An LLM stage paced at 100 requests/s (6,000 rpm, 16 in flight) against the loopback server
# with a strict 10 s sliding window (at most 1,000 in any 10 s), while other processes keep the
# disk busy (a 2 GB buffered write and sync in a loop, and two 4 KiB O_DSYNC writers), so the
# cache's fsyncs are slow. Prints, per run, the fullest 10 s window the server saw (1,000 is the
# limit; a client that keeps its pace fills ~995) and any 429s.
#
#   benches/rate_under_disk_pressure.sh [SCRATCH]            # this build
#   ROUNDS=3 BEFORE=/tmp/synth-old benches/rate_under_disk_pressure.sh   # and an older binary, interleaved
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-$(mktemp -d)}
ROUNDS=${ROUNDS:-3}
mkdir -p "$W"
cargo build --release --locked --bench mock_openai --bin synth >/dev/null 2>&1
MOCK=$(ls -t target/release/deps/mock_openai-* | grep -v '\.d$' | head -1)
SYNTH=$PWD/target/release/synth

source benches/llm_project.sh

pressure() {
  (while :; do dd if=/dev/zero of="$W/dd-big" bs=1M count=2000 2>/dev/null; sync; done) &
  P1=$!
  (while :; do dd if=/dev/zero of="$W/dd-a" bs=4k count=500 oflag=dsync 2>/dev/null; done) &
  P2=$!
  (while :; do dd if=/dev/zero of="$W/dd-b" bs=4k count=500 oflag=dsync 2>/dev/null; done) &
  P3=$!
}
calm() { kill "$P1" "$P2" "$P3" 2>/dev/null || true; wait "$P1" "$P2" "$P3" 2>/dev/null || true; rm -f "$W"/dd-*; }
trap calm EXIT

one() { # NAME BINARY
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$MOCK" --port "$port" --rpm 6000 --window-s 10 --seconds 25 2> "$W/mock.txt" &
  local mock=$!
  sleep 0.5
  rm -rf "$W/out"
  llm_project "$W" 1100 "kind = \"openai\"
base_url = \"http://127.0.0.1:$port/v1\"
model = \"m\"
api_key_env = \"SYNTH_BENCH_KEY\"
requests_per_minute = 6000
max_concurrency = 16
initial_concurrency = 16"
  pressure
  (cd "$W" && SYNTH_BENCH_KEY=k-123456789 "$2" -q run p.toml) || echo "$1: run FAILED"
  calm
  wait "$mock"
  printf '%-8s %s\n' "$1" "$(grep -o 'served.*' "$W/mock.txt")"
}

for _ in $(seq "$ROUNDS"); do
  [ -n "${BEFORE:-}" ] && one before "$BEFORE"
  one synth "$SYNTH"
done

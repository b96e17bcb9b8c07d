#!/usr/bin/env bash
# Cross-builds the library's tests for aarch64-unknown-linux-gnu and runs the retrieval
# tests (the gemm crate's NEON kernels, float64-reference equality, masks, duplicates,
# thread and tile independence) under qemu-user. Not part of every CI run: it builds the
# whole dependency tree a second time (about 25 minutes on 2 cores from cold; BENCHMARKS.md).
#
# Installs what it needs: Debian's cross gcc (linker, libc), clang 19 (the C/C++ compiler for
# the -sys crates: gcc 12 and clang 14 cannot build usearch's numkong SIMD kernels for aarch64) and
# qemu-user; the Rust standard library for the target through rustup.
#
# Usage: benches/aarch64.sh [test filter, default "retrieval"]
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-retrieval}"
target=aarch64-unknown-linux-gnu

need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v clang-19 >/dev/null || need+=(clang-19)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
if [ ${#need[@]} -gt 0 ]; then
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}"
fi
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=clang-19 CXX_aarch64_unknown_linux_gnu=clang++-19
export CFLAGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu"
export CXXFLAGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cross}"

started=$(date +%s)
cargo test --release --locked --target "$target" --lib --no-run
built=$(date +%s)
cargo test --release --locked --target "$target" --lib "$filter"
done_=$(date +%s)
echo "aarch64: build $((built - started)) s, tests under qemu $((done_ - built)) s"

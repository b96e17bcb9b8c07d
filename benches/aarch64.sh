#!/usr/bin/env bash
# Cross-builds the retrieval crate's tests (synth-retrieval) for aarch64-unknown-linux-gnu and
# runs them (the gemm crate's NEON kernels, float64-reference equality, masks, duplicates,
# thread and tile independence) under qemu-user. Not part of every CI run. Before the
# workspace move it built the whole library for the target (about 25 minutes on 2 cores from
# cold; BENCHMARKS.md); now only synth-retrieval and its few dependencies (not re-timed).
#
# Installs what it needs: Debian's cross gcc (linker, libc), clang 19 (the C/C++ compiler for
# the -sys crates: gcc 12 and clang 14 cannot build usearch's numkong SIMD kernels for aarch64) and
# qemu-user; the Rust standard library for the target through rustup.
#
# Usage: benches/aarch64.sh [test filter within synth-retrieval, default: all its tests]
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-}"
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

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cross}"
mkdir -p "$CARGO_TARGET_DIR"
# usearch's numkong 7.8 compiles SME kernels with clang 19 that call the SME runtime
# helper __arm_get_current_vg, which Debian 12's libgcc (GCC 12) lacks (GCC 14's libgcc
# and LLVM's compiler-rt have it). The linker wrapper adds this implementation of the ACLE
# ABI routine (VG, the vector length in 64-bit granules, when SVE is present; else 0).
# The retrieval tests never select those kernels (they are Mahalanobis/bilinear forms).
stub="$CARGO_TARGET_DIR/arm_get_current_vg.o"
if [ ! -f "$stub" ]; then
  cat > "$CARGO_TARGET_DIR/arm_get_current_vg.c" <<'C'
#include <sys/auxv.h>
#ifndef HWCAP_SVE
#define HWCAP_SVE (1 << 22)
#endif
unsigned long __arm_get_current_vg(void) {
    unsigned long vg = 0;
    if (getauxval(AT_HWCAP) & HWCAP_SVE) {
        __asm__ volatile(".inst 0x04e0e3e0\n\tmov %0, x0" : "=r"(vg) : : "x0"); /* cntd x0 */
    }
    return vg;
}
C
  clang-19 --target=aarch64-linux-gnu -O2 -c "$CARGO_TARGET_DIR/arm_get_current_vg.c" -o "$stub"
fi
linker="$CARGO_TARGET_DIR/aarch64-link.sh"
printf '#!/bin/sh\nexec aarch64-linux-gnu-gcc "$@" %s\n' "$(realpath "$stub")" > "$linker"
chmod +x "$linker"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="$(realpath "$linker")"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=clang-19 CXX_aarch64_unknown_linux_gnu=clang++-19
export CFLAGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu"
export CXXFLAGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu"

started=$(date +%s)
cargo test --release --locked --target "$target" -p synth-retrieval --lib --no-run
built=$(date +%s)
cargo test --release --locked --target "$target" -p synth-retrieval --lib $filter
done_=$(date +%s)
echo "aarch64: build $((built - started)) s, tests under qemu $((done_ - built)) s"

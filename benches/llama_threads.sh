#!/usr/bin/env bash
# llama.cpp's two CPU threading builds side by side: ggml's own thread pool (synth's default
# build, GGML_OPENMP=OFF) against OpenMP (`cargo build --features openmp`), on the same model,
# quiet and beside a running compiler (two g++ -O2 processes compiling llama.cpp's largest
# source file over and over: what `cargo build -j2` does to a 2-core machine).
# Both builds come from the llama.cpp sources vendored in llama-cpp-sys-2 (the crate synth
# links), with its flags: Release, x86-64 + AVX2/FMA/F16C/BMI2, no llamafile kernels. The
# llama library is built once (it does not depend on the threading build); ggml twice.
#   benches/llama_threads.sh [MODEL] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$PWD/.tools/models/SmolLM2-135M-Instruct.Q4_1.gguf}
STEPS=${2:-64}
W=${LLAMA_THREADS_DIR:-$PWD/.tools/llama-threads}
mkdir -p "$W"
SRC=$(cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
p = next(p for p in m["packages"] if p["name"] == "llama-cpp-sys-2")
print(os.path.join(os.path.dirname(p["manifest_path"]), "llama.cpp"))')
[ -f "$MODEL" ] || .ci/setup-model
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_LLAMAFILE=OFF -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF)
for omp in OFF ON; do
  b=$W/omp-$omp
  if [ ! -x "$b/llama_threads" ]; then
    cmake -S "$SRC" -B "$b" "${FLAGS[@]}" -DGGML_OPENMP=$omp > "$b.configure.log"
    if [ $omp = OFF ]; then cmake --build "$b" --target llama -j2 > "$b.build.log"
    else cmake --build "$b" --target ggml ggml-cpu ggml-base -j2 > "$b.build.log"; fi
    extra=(); [ $omp = ON ] && extra=(-fopenmp)
    g++ -O2 -std=c++17 benches/llama_threads.cpp -I "$SRC/include" -I "$SRC/ggml/include" \
      "$W/omp-OFF/src/libllama.a" "$b/ggml/src/libggml.a" "$b/ggml/src/libggml-cpu.a" \
      "$b/ggml/src/libggml-base.a" "${extra[@]}" -lpthread -ldl -lm -o "$b/llama_threads"
  fi
done
busy() { # two compilers, restarted as they finish
  for j in 1 2; do
    (while :; do g++ -O2 -std=c++17 -w -I "$SRC/include" -I "$SRC/ggml/include" -I "$SRC/src" \
      -c "$SRC/src/llama-model.cpp" -o "$W/busy-$j.o" || exit 1; echo >> "$W/busy.count"; done) &
  done
}
echo "machine: $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores; model $(basename "$MODEL"); $STEPS steps"
for load in quiet busy; do
  pids=()
  if [ $load = busy ]; then : > "$W/busy.count"; busy; sleep 5; fi
  for parallel in 1 16; do
    for threads in 1 2; do
      for omp in OFF ON; do
        printf '%-5s openmp %-3s ' $load $omp
        "$W/omp-$omp/llama_threads" "$MODEL" $parallel "$STEPS" $threads
      done
    done
  done
  if [ $load = busy ]; then
    pkill -P $$ || true; pkill -f "busy-[12].o" || true; wait 2>/dev/null || true
    echo "compiles finished beside it: $(wc -l < "$W/busy.count") (each one g++ -O2 of llama-model.cpp)"
  fi
done

#!/usr/bin/env bash
# llama.cpp's own C++ programs, the peer of the `local` provider: `llama-server` (its
# OpenAI-compatible server, continuous batching) and `llama-batched-bench` (the engine's
# ceiling: N sequences decoded together), built from the llama.cpp sources that ship in the
# PyPI sdist `llama-cpp-python==0.3.36` (vendor/llama.cpp), with llama.cpp's own defaults
# (CMake Release; GGML_NATIVE, OpenMP and llamafile as llama.cpp sets them), once, into
# .tools/llama.cpp-0.3.36/. Sourced, not run (after benches/lib.sh, for wait_http):
#   . benches/llama_cpp.sh; llama_cpp_install; llama_cpp_server_start MODEL PORT THREADS PARALLEL; ...; llama_cpp_server_stop
# LLAMA_CPP_CMAKE_ARGS adds CMake options (e.g. -DGGML_NATIVE=OFF -DGGML_AVX512=OFF for AVX2 code).
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-$PWD/.tools/llama.cpp-0.3.36}

llama_cpp_install() {
  if [ -x "$LLAMA_CPP_DIR/bin/llama-server" ] && [ -x "$LLAMA_CPP_DIR/bin/llama-batched-bench" ]; then
    return 0
  fi
  local python src build
  python=$(command -v python3 || command -v python)
  command -v cmake >/dev/null || { echo "cmake is needed (.ci/setup-build installs it)" >&2; return 1; }
  mkdir -p "$LLAMA_CPP_DIR"
  src="$LLAMA_CPP_DIR/src"
  if [ ! -f "$src/llama_cpp_python-0.3.36/vendor/llama.cpp/CMakeLists.txt" ]; then
    echo "downloading the sdist llama-cpp-python==0.3.36 (76 MB) from PyPI"
    mkdir -p "$src"
    "$python" -m pip download --quiet --no-deps --no-binary :all: -d "$src" 'llama-cpp-python==0.3.36'
    tar -xzf "$src/llama_cpp_python-0.3.36.tar.gz" -C "$src"
  fi
  build="$LLAMA_CPP_DIR/build"
  echo "building llama-server and llama-batched-bench (about 10 minutes on 2 cores)"
  # shellcheck disable=SC2086
  cmake -S "$src/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
    ${LLAMA_CPP_CMAKE_ARGS:-} >"$LLAMA_CPP_DIR/cmake.log" 2>&1 \
    || { tail -30 "$LLAMA_CPP_DIR/cmake.log"; return 1; }
  cmake --build "$build" -j "$(nproc)" --target llama-server llama-batched-bench >>"$LLAMA_CPP_DIR/cmake.log" 2>&1 \
    || { tail -30 "$LLAMA_CPP_DIR/cmake.log"; return 1; }
  mkdir -p "$LLAMA_CPP_DIR/bin"
  cp "$build/bin/llama-server" "$build/bin/llama-batched-bench" "$LLAMA_CPP_DIR/bin/"
  grep -m1 -i "GGML_NATIVE\|Including CPU backend\|Adding CPU backend variant" "$LLAMA_CPP_DIR/cmake.log" || true
}

# llama_cpp_server_start MODEL PORT THREADS PARALLEL [CTX_PER_SLOT]: llama.cpp's server with
# PARALLEL slots (continuous batching), in the background; waits until it answers.
llama_cpp_server_start() {
  local model=$1 port=$2 threads=$3 parallel=$4 ctx=${5:-4096}
  "$LLAMA_CPP_DIR/bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" \
    -t "$threads" -np "$parallel" -cb -c $((ctx * parallel)) --alias smollm2 --no-webui \
    > "${W:-/tmp}/llama_cpp_server.log" 2>&1 &
  LLAMA_CPP_SERVER_PID=$!
  wait_http "http://127.0.0.1:$port/health" llama-server "${W:-/tmp}/llama_cpp_server.log"
}

llama_cpp_server_stop() {
  if [ -n "${LLAMA_CPP_SERVER_PID:-}" ]; then kill "$LLAMA_CPP_SERVER_PID" 2>/dev/null; wait "$LLAMA_CPP_SERVER_PID" 2>/dev/null || true; fi
  LLAMA_CPP_SERVER_PID=
}

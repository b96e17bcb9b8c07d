#!/usr/bin/env bash
# llama-cpp-python's OpenAI-compatible server (PyPI `llama-cpp-python[server]==0.3.36`, built
# from its sdist: no wheel on PyPI; CMake and ninja come from PyPI too) serving a GGUF on
# 127.0.0.1, for the benchmarks that compare the `local` provider with it and for runs of a
# pipeline against a real server. Sourced, not run (after benches/lib.sh, for wait_http):
#   . benches/llama_server.sh; llama_server_install; llama_server_start MODEL PORT THREADS; ...; llama_server_stop
LLAMA_VENV=${LLAMA_VENV:-.tools/llamaserver-venv}

llama_server_install() {
  if [ -x "$LLAMA_VENV/bin/python" ] && "$LLAMA_VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
    return 0
  fi
  local python
  python=$(command -v python3 || command -v python)
  echo "building llama-cpp-python[server]==0.3.36 into $LLAMA_VENV (about 20 minutes on 2 cores)"
  "$python" -m venv "$LLAMA_VENV"
  # No OpenMP (ggml's own thread pool, as synth's build), no -march=native, no multimodal library.
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF" \
    "$LLAMA_VENV/bin/pip" install --quiet 'llama-cpp-python[server]==0.3.36'
}

# llama_server_start MODEL PORT THREADS [N_CTX]: start it in the background, wait until it answers.
llama_server_start() {
  local model=$1 port=$2 threads=$3 n_ctx=${4:-4096}
  "$LLAMA_VENV/bin/python" -m llama_cpp.server --model "$model" --host 127.0.0.1 --port "$port" \
    --n_threads "$threads" --n_threads_batch "$threads" --n_ctx "$n_ctx" --verbose false \
    > "${W:-/tmp}/llama_server.log" 2>&1 &
  LLAMA_SERVER_PID=$!
  wait_http "http://127.0.0.1:$port/v1/models" "llama-cpp-python's server" "${W:-/tmp}/llama_server.log"
}

llama_server_stop() {
  if [ -n "${LLAMA_SERVER_PID:-}" ]; then kill "$LLAMA_SERVER_PID" 2>/dev/null; wait "$LLAMA_SERVER_PID" 2>/dev/null || true; fi
  LLAMA_SERVER_PID=
}

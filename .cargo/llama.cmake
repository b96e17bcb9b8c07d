# Included by CMake right after each project() call of the llama.cpp build that
# llama-cpp-sys-2 runs (.cargo/config.toml sets CMAKE_PROJECT_INCLUDE; the crate's build
# script passes every CMAKE_* variable on to CMake, and every GGML_* variable as a cache
# entry, and reruns when one of those changes).
#
# 1. No `common` library. llama-cpp-2 turns on llama-cpp-sys-2's default `common` feature
#    whatever its user asks, so the build script defines LLAMA_BUILD_COMMON=ON; synth calls
#    nothing of llama.cpp's `common` library (chat templates, argument parsing, cpp-httplib,
#    ...), which is more than half of llama.cpp's compile time (BENCHMARKS.md "Cold build").
#    Forcing the cache entry off here, before llama.cpp's option() reads it, skips that
#    library; the build script then finds no common library to link and links none (its
#    wrapper's objects are never referenced).
if(PROJECT_NAME STREQUAL "llama.cpp")
  set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
endif()

# 2. ggml's CPU code for the machine that builds it (GGML_SYNTH_NATIVE=ON; OFF by default in
#    .cargo/config.toml): `-march=native`, as llama.cpp's own builds do, so an AVX-512 (or
#    AVX-VNNI) CPU runs its AVX-512 kernels instead of the AVX2 ones llama-cpp-sys-2 picks
#    for Rust's baseline target (its build script sets GGML_NATIVE only for
#    `-C target-cpu=native`, which would change every Rust crate too). AMX stays off: its
#    kernels take over quantized matrix products and compute a many-column product in
#    another order than a one-column one, which would make a sequence's numbers depend on
#    what else is decoded (src/providers/local/engine.rs, the batch invariant). OFF (the default):
#    AVX2 + FMA + F16C, the baseline of every x86-64 machine since 2013-2015, whose numbers
#    every machine computes alike.
if(PROJECT_NAME STREQUAL "ggml" AND GGML_SYNTH_NATIVE
   AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(GGML_NATIVE ON CACHE BOOL "ggml: optimize the build for the current system" FORCE)
  add_compile_options(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
  message(STATUS "synth: ggml for this machine's CPU (-march=native, no AMX)")
endif()

# Included by CMake right after each project() call of the llama.cpp build that
# llama-cpp-sys-2 runs (.cargo/config.toml sets CMAKE_PROJECT_INCLUDE; the crate's build
# script passes every CMAKE_* variable on to CMake). llama-cpp-2 turns on llama-cpp-sys-2's
# default `common` feature whatever its user asks, so the build script defines
# LLAMA_BUILD_COMMON=ON; synth calls nothing of llama.cpp's `common` library (chat
# templates, argument parsing, cpp-httplib, ...), which is more than half of llama.cpp's
# compile time (BENCHMARKS.md "Cold build"). Forcing the cache entry off here, before
# llama.cpp's option() reads it, skips that library; the build script then finds no
# common library to link and links none (its wrapper's objects are never referenced).
if(PROJECT_NAME STREQUAL "llama.cpp")
  set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
endif()

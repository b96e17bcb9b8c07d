//! The `synth` binary: everything lives in the library; this only hands over the
//! exit code, and picks the allocator.

/// mimalloc instead of glibc's malloc: an LLM request allocates and frees hundreds of
/// small buffers (JSON, headers, futures); with glibc that was ~12% of the client's
/// CPU per request (BENCHMARKS.md, "LLM provider layer").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // A write past a file-size limit should fail with an error we can report, not kill us.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    std::process::exit(synth::cli::main());
}

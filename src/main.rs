//! The `synth` binary: everything lives in the library; this only hands over the
//! exit code, and picks the allocator.

/// mimalloc instead of glibc's malloc: an LLM request allocates and frees hundreds of
/// small buffers (JSON, headers, futures); with glibc that was ~12% of the client's
/// CPU per request (BENCHMARKS.md, "LLM provider layer"). Built with its `no_thp`
/// feature: mimalloc otherwise asks the kernel for transparent huge pages on all its
/// memory, and the kernel then zeroes (and compacts for) 2 MiB at a time on first touch;
/// a batch collection of 40,000 answers spent ~14% of its network thread there (now
/// 2.18 -> 1.75 s, 195 -> 163 MiB; BENCHMARKS.md, "Batch mode"). The system's own THP
/// setting still applies.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // A write past a file-size limit should fail with an error we can report, not kill us.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    std::process::exit(synth::cli::main(synth::registry::builtin()));
}

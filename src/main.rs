//! The `synth` binary: everything lives in the library; this only hands over the
//! exit code.

fn main() {
    // A write past a file-size limit should fail with an error we can report, not kill us.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    std::process::exit(synth::cli::main());
}

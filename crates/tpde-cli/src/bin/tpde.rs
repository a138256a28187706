//! `tpde`: the command line of [`tpde_cli::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    keep_freed_memory();
    ExitCode::from(tpde_cli::cli::tpde(std::env::args_os()))
}

/// Keeps glibc from handing every large buffer back to the kernel when it is freed. The codecs
/// allocate a few MiB per chunk; above glibc's default threshold each such buffer is a fresh
/// `mmap` whose pages fault in and are zeroed again, chunk after chunk (measured: a large share
/// of a pack's time).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; it is called before any other thread
    // exists, and both values are in the ranges glibc documents (the mmap threshold is at most
    // 32 MiB on 64-bit targets).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

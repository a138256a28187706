//! The `tpde` and `tpde-inspect` command-line tools: conversion to and from safetensors,
//! inspection, verification, a demo on a generated checkpoint, and a benchmark.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod conformance;
pub mod demo;
#[cfg(feature = "gpu")]
pub mod gpu_bench;
#[cfg(feature = "gpu")]
pub mod gpu_unpack;
pub mod inspect;

// The conversions live in the `tpde` library crate; the tools are a layer over it.
pub use tpde::{open, pack, ratio, series, unpack, verify};

use std::fmt;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A failure of a command, with the exit code the tools promise: 1 for a corrupt file, a
/// failed verification or any other error, 2 for usage errors (clap's own code).
#[derive(Clone, Debug)]
pub struct CliError {
    /// Process exit code.
    pub code: u8,
    /// What to print on stderr.
    pub message: String,
    /// The error category, when it came from the format layer.
    pub kind: Option<tpde::format::ErrorKind>,
}

impl CliError {
    /// A failure with exit code 1.
    pub fn failed(message: impl Into<String>) -> Self {
        CliError { code: 1, message: message.into(), kind: None }
    }
    /// A usage error, exit code 2.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError { code: 2, message: message.into(), kind: None }
    }

    /// The same error naming the file `at` it is about, unless its message names it already
    /// (errors of a chain name the link they come from; those of the file itself may not).
    pub fn about(mut self, at: &impl fmt::Display) -> Self {
        let at = at.to_string();
        if !self.message.contains(&at) {
            self.message = format!("{at}: {}", self.message);
        }
        self
    }
}

impl CliError {
    /// Standard output was closed by its reader (`tpde inspect ... | head`): not a failure, the
    /// reader has what it wanted. `main` ends quietly, with status 0, on this one.
    pub fn closed_pipe() -> Self {
        CliError { code: 0, message: String::new(), kind: None }
    }

    /// Whether this is [`CliError::closed_pipe`].
    pub fn is_closed_pipe(&self) -> bool {
        self.code == 0
    }
}

/// Writes to standard output, as `print!` does, but a closed pipe is
/// [`CliError::closed_pipe`] instead of `print!`'s panic.
pub fn out(args: fmt::Arguments<'_>) -> Result<(), CliError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_fmt(args).and_then(|()| stdout.flush()).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => CliError::closed_pipe(),
        _ => CliError::failed(format!("standard output: {e}")),
    })
}

/// `print!` through [`out`]: `out!(...)?`.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::out(format_args!($($arg)*)) };
}

/// `println!` through [`out`]: `outln!(...)?`.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::out(format_args!("{}\n", format_args!($($arg)*))) };
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<tpde::Error> for CliError {
    fn from(e: tpde::Error) -> Self {
        CliError { code: if e.is_usage() { 2 } else { 1 }, kind: Some(e.kind()), message: e.to_string() }
    }
}

impl From<tpde::read::ReadError> for CliError {
    fn from(e: tpde::read::ReadError) -> Self {
        tpde::Error::from(e).into()
    }
}

#[cfg(feature = "gpu")]
impl From<tpde_gpu::GpuError> for CliError {
    fn from(e: tpde_gpu::GpuError) -> Self {
        CliError { code: 1, kind: Some(e.kind()), message: e.to_string() }
    }
}

impl From<tpde::write::WriteError> for CliError {
    fn from(e: tpde::write::WriteError) -> Self {
        tpde::Error::from(e).into()
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        tpde::Error::from(e).into()
    }
}

/// A progress bar on stderr, drawn from the library's [`tpde::Progress`] callbacks.
pub struct Bar(pub ProgressBar);

impl tpde::Progress for Bar {
    fn set_length(&self, bytes: u64) {
        self.0.set_length(bytes);
    }
    fn inc(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// A byte-count progress bar on stderr; indicatif hides it when stderr is not a terminal.
pub fn progress_bar(len: u64, what: &str) -> Bar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    Bar(bar)
}

/// Megabytes (10^6 bytes) per second.
pub fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds.max(1e-9)
}

/// Runs `tpde-inspect` (also `tpde inspect`): prints the report of `path` as text or JSON.
pub fn run_inspect(at: &tpde::Location, json: bool, chunks: bool, full: bool) -> Result<(), CliError> {
    if let tpde::Location::Local(folder) = at {
        if folder.is_dir() {
            let links = tpde::verify::folder_chains(folder)?;
            if links.is_empty() {
                let why =
                    "a folder with no TPDE file in it or below (inspect takes a file, or a folder of checkpoints)";
                return Err(CliError::failed(format!("{}: {why}", folder.display())));
            }
            return match json {
                true => {
                    outln!("{}", serde_json::to_string_pretty(&inspect::chains_json(folder, &links)).expect("json"))
                }
                false => out!("{}", inspect::render_chains(&links)),
            };
        }
    }
    let opened = at
        .open()
        .map_err(CliError::from)
        .and_then(|src| Ok(tpde::read::Reader::from_source(src)?))
        .map_err(|e| e.about(at));
    match opened {
        Ok(r) => {
            let rep = inspect::report(&at.to_string(), &r, chunks);
            if json {
                outln!("{}", serde_json::to_string_pretty(&rep).expect("report serializes"))
            } else {
                out!("{}", inspect::render_text(&rep, full))
            }
        }
        Err(e) => {
            let err = e;
            if json {
                let v = serde_json::json!({
                    "schema": inspect::SCHEMA,
                    "file": at.to_string(),
                    "error": { "kind": err.kind.map(|k| k.as_str()), "message": err.message },
                });
                outln!("{}", serde_json::to_string_pretty(&v).expect("json"))?;
            }
            Err(err)
        }
    }
}

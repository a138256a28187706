//! `tpde-inspect FILE [--json] [--chunks] [--full]`: what a TPDE file holds.
//! Exit codes: 0 ok, 1 not readable (corrupt, truncated, not TPDE, unsupported), 2 usage.

use std::process::ExitCode;

use clap::Parser;

/// Show a TPDE file's format version, flags, sizes, metadata and tensors.
#[derive(Parser)]
#[command(name = "tpde-inspect", version)]
struct Args {
    /// The .tpde file: a path or an s3://bucket/key URL.
    #[arg(value_parser = |s: &str| tpde::Location::parse(s).map_err(|e| e.to_string()))]
    file: tpde::Location,
    /// Print JSON (schema "tpde-inspect/1") instead of a table.
    #[arg(long)]
    json: bool,
    /// List every chunk of every tensor.
    #[arg(long)]
    chunks: bool,
    /// Metadata values whole (the table cuts each to a line).
    #[arg(long)]
    full: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match tpde_tools::run_inspect(&args.file, args.json, args.chunks, args.full) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_closed_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpde-inspect: {}: {e}", args.file);
            ExitCode::from(e.code)
        }
    }
}

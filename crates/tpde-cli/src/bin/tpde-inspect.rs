//! `tpde-inspect`: the command line of [`tpde_cli::cli::tpde_inspect`].

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(tpde_cli::cli::tpde_inspect(std::env::args_os()))
}

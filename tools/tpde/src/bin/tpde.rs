//! `tpde`: pack, unpack, verify, cat, inspect, demo, bench.
//! Exit codes: 0 ok, 1 corrupt input, failed verification or any other failure, 2 usage.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::HumanBytes;
use tpde_read::Reader;
use tpde_tools::{bench, convert, demo, inspect, mb_per_s, progress_bar, ratio, CliError};
use tpde_write::{WriteOptions, DEFAULT_CHUNK_BYTES};

/// TPDE: checkpoints as keyframes and bit-exact deltas.
#[derive(Parser)]
#[command(name = "tpde", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pack a safetensors file into a .tpde file.
    Pack {
        /// The .safetensors input.
        input: PathBuf,
        /// The .tpde output (written atomically).
        #[arg(short, long)]
        output: PathBuf,
        /// Chunk codec: raw or zstd.
        #[arg(long, default_value = "zstd")]
        codec: String,
        /// zstd level (1..=22, or negative for the fast modes); zstd's default is 3.
        #[arg(long, allow_negative_numbers = true)]
        level: Option<i32>,
        /// Decoded bytes per chunk.
        #[arg(long, default_value_t = DEFAULT_CHUNK_BYTES)]
        chunk_size: u64,
    },
    /// Unpack a .tpde file into a safetensors file.
    Unpack {
        /// The .tpde input.
        input: PathBuf,
        /// The .safetensors output (written atomically).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Check every CRC, every tensor digest and the whole structure; exit 1 on corruption.
    Verify {
        /// The .tpde file.
        file: PathBuf,
    },
    /// Write the raw little-endian bytes of one tensor to stdout.
    Cat {
        /// The .tpde file.
        file: PathBuf,
        /// The tensor's name.
        tensor: String,
    },
    /// Same as `tpde-inspect`.
    Inspect {
        /// The .tpde file.
        file: PathBuf,
        /// JSON output (schema "tpde-inspect/1").
        #[arg(long)]
        json: bool,
        /// List every chunk.
        #[arg(long)]
        chunks: bool,
    },
    /// Make a realistic checkpoint, pack, inspect, verify and unpack it, and check the round trip.
    Demo {
        /// Keep the files in this directory (default: a temporary one, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Pack/unpack throughput next to zstd and safetensors on one safetensors file.
    Bench {
        /// The .safetensors input (default: the demo checkpoint).
        input: Option<PathBuf>,
        /// Timed runs per measurement (median reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where to write outputs (a tmpfs measures codecs, a disk measures the disk).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpde: {e}");
            ExitCode::from(e.code)
        }
    }
}

fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Pack { input, output, codec, level, chunk_size } => {
            let encoder = convert::encoder(&codec, level)?;
            if chunk_size == 0 {
                return Err(CliError::usage("--chunk-size must be positive"));
            }
            let bar = progress_bar(0, "packing");
            let r = convert::pack(
                &input,
                &output,
                WriteOptions { encoder, chunk_bytes: chunk_size, ..WriteOptions::default() },
                &bar,
            )?;
            eprintln!(
                "packed {} tensors: {} -> {} (ratio {:.3}) in {:.2} s, {:.0} MB/s",
                r.tensors,
                HumanBytes(r.logical_bytes),
                HumanBytes(r.file_bytes),
                ratio(r.stored_bytes, r.logical_bytes),
                r.seconds,
                mb_per_s(r.logical_bytes, r.seconds)
            );
            Ok(())
        }
        Command::Unpack { input, output } => {
            let bar = progress_bar(0, "unpacking");
            let r = convert::unpack(&input, &output, &bar)?;
            eprintln!(
                "unpacked {} tensors ({}) in {:.2} s, {:.0} MB/s",
                r.tensors,
                HumanBytes(r.logical_bytes),
                r.seconds,
                mb_per_s(r.logical_bytes, r.seconds)
            );
            Ok(())
        }
        Command::Verify { file } => verify(&file),
        Command::Cat { file, tensor } => {
            let r = Reader::open(&file)?;
            let data = r.read(&tensor)?;
            let mut out = std::io::stdout().lock();
            match out.write_all(&data).and_then(|()| out.flush()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => Ok(other?),
            }
        }
        Command::Inspect { file, json, chunks } => tpde_tools::run_inspect(&file, json, chunks),
        Command::Demo { dir } => run_demo(dir),
        Command::Bench { input, runs, dir } => {
            let (work, _keep) = demo::workdir(dir)?;
            let input = match input {
                Some(p) => p,
                None => {
                    let p = work.join("demo.safetensors");
                    demo::write_checkpoint(demo::DemoModel::default(), 1000, 7, &p)?;
                    p
                }
            };
            let rows = bench::run(&input, &work, runs.max(1))?;
            print!("{}", bench::render(&input, &rows, runs.max(1)));
            Ok(())
        }
    }
}

fn verify(file: &std::path::Path) -> Result<(), CliError> {
    let r = Reader::open(file)?;
    let bar = progress_bar(r.tensors().iter().map(|t| t.byte_length).sum(), "verifying");
    let report = r.verify_with(|t| bar.inc(t.byte_length))?;
    bar.finish_and_clear();
    println!(
        "ok: {} tensors, {} chunks, {} logical, {} stored; content digest {}",
        report.tensors,
        report.chunks,
        HumanBytes(report.logical_bytes),
        HumanBytes(report.stored_bytes),
        tpde_format::digest::to_hex(&r.content_digest())
    );
    Ok(())
}

fn run_demo(dir: Option<PathBuf>) -> Result<(), CliError> {
    let (work, temp) = demo::workdir(dir)?;
    let src = work.join("demo.safetensors");
    let packed = work.join("demo.tpde");
    let back = work.join("demo.unpacked.safetensors");
    let mut steps: Vec<(String, String, f64)> = Vec::new();

    let t = Instant::now();
    let logical = demo::write_checkpoint(demo::DemoModel::default(), 1000, 7, &src)?;
    steps.push((
        "make checkpoint".into(),
        format!("{} as safetensors", HumanBytes(logical)),
        t.elapsed().as_secs_f64(),
    ));

    let bar = progress_bar(0, "packing");
    let opts = WriteOptions { encoder: convert::encoder("zstd", None)?, ..WriteOptions::default() };
    let p = convert::pack(&src, &packed, opts, &bar)?;
    steps.push((
        "tpde pack --codec zstd".into(),
        format!(
            "{} -> {} (ratio {:.3})",
            HumanBytes(p.logical_bytes),
            HumanBytes(p.file_bytes),
            ratio(p.file_bytes, p.logical_bytes)
        ),
        p.seconds,
    ));

    let r = Reader::open(&packed)?;
    println!("{}", inspect::render_text(&inspect::report(&packed, &r, false)));

    let t = Instant::now();
    let report = r.verify()?;
    steps.push((
        "tpde verify".into(),
        format!("{} tensors, {} chunks ok", report.tensors, report.chunks),
        t.elapsed().as_secs_f64(),
    ));

    let bar = progress_bar(0, "unpacking");
    let u = convert::unpack(&packed, &back, &bar)?;
    let diff = convert::compare_safetensors(&src, &back)?;
    steps.push((
        "tpde unpack + compare".into(),
        match &diff {
            None => format!("{} tensors bit-exact", u.tensors),
            Some(d) => format!("MISMATCH: {d}"),
        },
        u.seconds,
    ));

    println!("| step | result | seconds |\n|---|---|---:|");
    for (step, result, secs) in &steps {
        println!("| {step} | {result} | {secs:.2} |");
    }
    if let Some(d) = diff {
        return Err(CliError::failed(format!("round trip is not bit-exact: {d}")));
    }
    if temp.is_none() {
        println!("\nfiles kept in {}", work.display());
    }
    Ok(())
}

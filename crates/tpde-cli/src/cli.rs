//! The `tpde` command line (pack, pack-series, unpack, verify, cat, inspect, demo, bench) as a
//! function of its arguments: what the `tpde` binary runs, and the `tpde` command a `pip
//! install` provides (through the Python extension). Exit codes: 0 ok, 1 corrupt input, failed
//! verification or any other failure, 2 usage.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::{bench, conformance, demo, mb_per_s, out, outln, progress_bar, ratio, CliError};
use clap::{Parser, Subcommand};
use indicatif::HumanBytes;
use tpde::codec::Encoder;
use tpde::write::{WriteOptions, DEFAULT_CHUNK_BYTES};
use tpde::{open, series, unpack, verify as against, Location, PackJob, PackReport, PackSource};

/// TPDE: checkpoints as keyframes and bit-exact deltas.
#[derive(Parser)]
#[command(name = "tpde", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pack a safetensors file, or a Hugging Face model folder (its model.safetensors or its
    /// shards and *.safetensors.index.json, and the files beside them: config, tokenizer,
    /// README), into one .tpde file: a keyframe, or with --base a delta.
    Pack {
        /// The .safetensors input, or a model folder.
        input: PathBuf,
        /// The .tpde output (written atomically), a path or an s3://bucket/key URL.
        #[arg(short, long, value_parser = location)]
        output: Location,
        /// The checkpoint to write a delta against: a .tpde (keyframe or delta, a path or a
        /// URL), a .safetensors, or a model folder (a fine-tune against its base model).
        #[arg(long, value_parser = location)]
        base: Option<Location>,
        #[command(flatten)]
        codec: CodecArgs,
    },
    /// Pack every .safetensors file of a folder, in name order, as a chain of deltas.
    PackSeries {
        /// The folder of checkpoints.
        dir: PathBuf,
        /// The output folder (one .tpde per checkpoint, same stem): a path or an
        /// s3://bucket/prefix URL.
        #[arg(short, long, value_parser = location)]
        output: Location,
        /// Start a new chain with a keyframe every N checkpoints.
        #[arg(long, default_value_t = 10)]
        keyframe_every: usize,
        #[command(flatten)]
        codec: CodecArgs,
    },
    /// Unpack a .tpde file into a safetensors file; a file packed from a model folder into
    /// that folder again (its files, its weights, then its index), unless the output ends in
    /// .safetensors.
    Unpack {
        /// The .tpde input: a path or an s3://bucket/key URL.
        #[arg(value_parser = location)]
        input: Location,
        /// The .safetensors output, or the folder (each file written atomically).
        #[arg(short, long)]
        output: PathBuf,
        /// The base of a delta (default: found through the path hint the file records).
        #[arg(long, value_parser = location)]
        base: Option<Location>,
        /// A model folder that has files is replaced whole, in one step (refused without it:
        /// never a mix of two versions, nor a stale file beside the new ones).
        #[arg(long)]
        replace: bool,
        /// Decode on the GPU (tpde-gpu): the file and its bases are decoded into device
        /// memory, read back and checked against their digests.
        #[arg(long)]
        gpu: bool,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Check every CRC, every tensor digest and the whole structure; exit 1 on corruption. A
    /// folder: every TPDE file in it or below, each with the chain it needs.
    Verify {
        /// The .tpde file (a path or an s3://bucket/key URL), or a folder.
        #[arg(value_parser = location)]
        file: Location,
        /// The base of a delta (default: found through the path hint the file records).
        #[arg(long, value_parser = location)]
        base: Option<Location>,
        /// Also compare the decoded tensors with the checkpoint the file was packed from:
        /// bit-exact, or within the bound a lossy file records.
        #[arg(long)]
        against: Option<PathBuf>,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Copy a file between a path and an s3://bucket/key URL (or two of either), streaming;
    /// the copy appears whole or not at all.
    Cp {
        /// The file to copy.
        #[arg(value_parser = location)]
        from: Location,
        /// Where the copy goes.
        #[arg(value_parser = location)]
        to: Location,
    },
    /// Write the raw little-endian bytes of one tensor to stdout.
    Cat {
        /// The .tpde file: a path or an s3://bucket/key URL (a delta's base is found through
        /// its path hint).
        #[arg(value_parser = location)]
        file: Location,
        /// The tensor's name.
        tensor: String,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Run a conformance corpus (`conformance/` in the repository): every valid file must
    /// decode to its manifest entry and every invalid one fail with its error category.
    Conformance {
        /// The corpus folder, holding manifest.json, valid/ and invalid/.
        dir: PathBuf,
        /// Print only the failures and the totals.
        #[arg(long, short)]
        quiet: bool,
        /// Decode on the GPU (tpde-gpu) instead of the CPU reader.
        #[arg(long)]
        gpu: bool,
    },
    /// Read one file as the conformance corpus does and print the JSON that
    /// `conformance/run.py` expects of a reader (the reference reader as that runner's example).
    #[command(hide = true)]
    ConformanceRead {
        /// The file.
        file: PathBuf,
        /// Its base, then that base's base, and so on.
        #[arg(long)]
        base: Vec<PathBuf>,
        /// Find the bases through the files' path hints instead.
        #[arg(long)]
        follow_hints: bool,
    },
    /// Same as `tpde-inspect`.
    Inspect(InspectArgs),
    /// Train a tiny model for 60 steps, pack its six checkpoints as a keyframe and deltas, then
    /// inspect, verify and unpack the newest and check the round trip.
    Demo {
        /// Keep the files in this directory (default: a temporary one, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Pack/unpack throughput next to zstd and safetensors on one safetensors file.
    Bench {
        /// The .safetensors checkpoint (default: the demo checkpoint); more checkpoints of the
        /// same run, oldest first, add deltas on the one before and the restore of each step
        /// of their chain.
        inputs: Vec<PathBuf>,
        /// Timed runs per measurement (median reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where to write outputs (a tmpfs measures codecs, a disk measures the disk).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// GPU decode throughput per codec next to a plain upload and the CPU reader.
    BenchGpu {
        /// The .safetensors checkpoint (default: the demo checkpoint, step 1000).
        input: Option<PathBuf>,
        /// A previous checkpoint (.safetensors) to measure deltas against (default with the
        /// demo: the demo checkpoint at step 990).
        #[arg(long)]
        base: Option<PathBuf>,
        /// Timed runs per measurement (median reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Without an input: generate a demo checkpoint of about this many MB (10^6 bytes)
        /// instead of the small default (about 53 MB).
        #[arg(long, conflicts_with = "input")]
        demo_mb: Option<u64>,
        /// Also measure bf16 and fp32 keyframes, a near-empty delta and the layer loader at
        /// each size decade (1, 16, 256 MB) up to this many MB.
        #[arg(long, value_name = "MB")]
        decades: Option<u64>,
    },
}

/// How `unpack`, `cat` and `verify` read a file they may not trust. A base's path hint is
/// followed by default only into the file's own folder (or bucket): a file from elsewhere must
/// not make the command open a path of its choosing (spec §7.3).
#[derive(clap::Args)]
struct ReadArgs {
    /// The largest tensor decoded, in bytes; a larger one is refused (limit-exceeded) before
    /// anything is decoded.
    #[arg(long, default_value_t = tpde::read::DEFAULT_MAX_TENSOR_BYTES)]
    max_bytes: u64,
    /// Follow a base's path hint only to a file inside this folder (repeatable); by default
    /// only into the file's own folder.
    #[arg(long)]
    hint_root: Vec<PathBuf>,
    /// Follow every local path hint, wherever it leads (for your own files).
    #[arg(long, conflicts_with = "hint_root")]
    follow_hints: bool,
    /// Follow no path hints: a delta's base must be given with --base.
    #[arg(long, conflicts_with_all = ["hint_root", "follow_hints"])]
    no_hints: bool,
}

impl ReadArgs {
    fn options(&self) -> open::OpenOptions {
        let mut o = open::OpenOptions { hints: open::HintPolicy::confined(), ..Default::default() };
        o.read.max_tensor_bytes = self.max_bytes;
        if self.no_hints {
            o.hints = open::HintPolicy::none();
        } else if self.follow_hints {
            o.hints.paths = tpde::read::PathHints::Follow;
        } else if !self.hint_root.is_empty() {
            o.hints.paths = tpde::read::PathHints::Within(self.hint_root.clone());
        }
        o
    }
}

/// Codec choice shared by `pack` and `pack-series`.
#[derive(clap::Args)]
struct CodecArgs {
    /// Chunk codec: auto (per chunk, the smallest lossless form among those that decode lanes
    /// side by side on a CPU and in parallel on a GPU: planes-context for a keyframe, which
    /// falls back to planes-lanes records where contexts do not pay; against a base the
    /// smallest of delta-xor-context, delta-sub-context and sparse-packed-lanes),
    /// auto-serial (the smallest among the format 1.1 codecs: readable by 1.1 readers, slower
    /// to decode), or one codec for every chunk: raw, zstd, planes, delta-xor, delta-sub,
    /// sparse-elias-delta, sparse-fibonacci, sparse-rice, sparse-packed, planes-lanes,
    /// delta-xor-lanes, delta-sub-lanes, sparse-packed-lanes, planes-context,
    /// delta-xor-context, delta-sub-context.
    #[arg(long, default_value = "auto")]
    codec: String,
    /// Which readers the codecs are chosen for: cpu (any codec), or gpu (only codecs a GPU
    /// decodes in parallel, spec §6.7: auto, raw and the lane forms).
    #[arg(long, value_enum, default_value_t = ProfileArg::Cpu)]
    profile: ProfileArg,
    /// zstd level (1..=22, or negative for the fast modes); zstd's default is 3.
    #[arg(long, allow_negative_numbers = true)]
    level: Option<i32>,
    /// Decoded bytes per chunk.
    #[arg(long, default_value_t = DEFAULT_CHUNK_BYTES)]
    chunk_size: u64,
    /// LOSSY: a float element that changed by at most this much from the base keeps the base's
    /// value. Off by default; recorded in the file as tpde.max_abs_error.
    #[arg(long)]
    max_abs_error: Option<f64>,
    /// LOSSY: a float element x that changed by at most this share of |x| (plus
    /// --max-abs-error, if given) keeps the base's value: one bound for tensors of any scale.
    /// Off by default; recorded in the file as tpde.max_rel_error (format 1.5).
    #[arg(long)]
    max_rel_error: Option<f64>,
}

/// Which readers `pack` chooses codecs for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ProfileArg {
    /// Any codec.
    Cpu,
    /// Only codecs a GPU decodes in parallel (spec §6.7): `raw` and the lane forms.
    Gpu,
}

/// The encoder `--codec NAME [--level L] [--profile P]` asks for, in the command line's words.
fn encoder(codec: &str, level: Option<i32>, profile: ProfileArg) -> Result<Encoder, CliError> {
    let mut encoder: Encoder =
        codec.parse().map_err(|e: tpde::codec::UnknownEncoder| CliError::usage(e.to_string()))?;
    match (&mut encoder, level) {
        (Encoder::Zstd { level }, Some(l)) => {
            let range = zstd::compression_level_range();
            if !range.contains(&l) {
                return Err(CliError::usage(format!("--level {l} is outside zstd's {range:?}")));
            }
            *level = l;
        }
        (_, Some(_)) => return Err(CliError::usage("--level applies to --codec zstd only")),
        _ => {}
    }
    if matches!(profile, ProfileArg::Gpu) && !encoder.gpu_parallel() {
        let names: Vec<&str> =
            tpde::format::CodecTag::ALL.iter().filter(|t| t.gpu_parallel()).map(|t| t.name()).collect();
        return Err(CliError::usage(format!(
            "--profile gpu writes only codecs a GPU decodes in parallel: auto, {}; not {codec}",
            names.join(", ")
        )));
    }
    Ok(encoder)
}

impl CodecArgs {
    fn options(&self) -> Result<WriteOptions, CliError> {
        let encoder = encoder(&self.codec, self.level, self.profile)?;
        if self.chunk_size == 0 {
            return Err(CliError::usage("--chunk-size must be positive"));
        }
        for (flag, bound) in [("--max-abs-error", self.max_abs_error), ("--max-rel-error", self.max_rel_error)] {
            if bound.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
                return Err(CliError::usage(format!("{flag} must be a finite number >= 0")));
            }
        }
        Ok(WriteOptions { encoder, chunk_bytes: self.chunk_size, ..WriteOptions::default() })
    }
}

/// `tpde-inspect FILE [--json] [--chunks] [--full]`: show a TPDE file's format version, flags,
/// sizes, metadata and tensors. Exit codes: 0 ok, 1 not readable (corrupt, truncated, not TPDE,
/// unsupported), 2 usage.
#[derive(Parser)]
#[command(name = "tpde-inspect", version)]
struct InspectArgs {
    /// The .tpde file: a path or an s3://bucket/key URL; or a folder: which of its TPDE files
    /// each needs, and which need it.
    #[arg(value_parser = location)]
    file: Location,
    /// Print JSON (schema "tpde-inspect/1", "tpde-inspect-folder/1") instead of a table.
    #[arg(long)]
    json: bool,
    /// List every chunk of every tensor.
    #[arg(long)]
    chunks: bool,
    /// Metadata values whole (the table cuts each to a line).
    #[arg(long)]
    full: bool,
}

/// Runs `tpde-inspect ARGS` (`args` starts with the program's name) and returns its exit status.
pub fn tpde_inspect<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match InspectArgs::try_parse_from(args) {
        // Its errors name the file (issue 58: "tpde-inspect: F: F: ...").
        Ok(a) => exit_code(crate::run_inspect(&a.file, a.json, a.chunks, a.full), "tpde-inspect"),
        Err(e) => usage_exit(e),
    }
}

/// The exit status of a command that ended with `result`; an error is printed after `who: `.
fn exit_code(result: Result<(), CliError>, who: &str) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) if e.is_closed_pipe() => 0,
        Err(e) => {
            eprintln!("{who}: {e}");
            e.code
        }
    }
}

/// Why `unpack` leaves this to Python: a framework's checkpoint folder (the plug-ins' stored
/// `checkpoint.tpde`), or a `torch.save` output, is written back by the Python package's
/// `tpde` (`tpde/_cli.py`), which has torch.
fn framework_unpack(input: &Location, output: &std::path::Path) -> Option<String> {
    let python = "the `tpde` command of the Python package (pip install ./crates/tpde-py) writes it";
    if let Location::Local(dir) = input {
        if dir.is_dir() && dir.join("checkpoint.tpde").is_file() {
            return Some(format!(
                "{}: a framework's checkpoint folder; {python} back as the framework wrote it",
                dir.display()
            ));
        }
    }
    let torch = output.extension().and_then(|e| e.to_str()).is_some_and(|e| ["ckpt", "pt", "pth", "bin"].contains(&e));
    torch.then(|| {
        format!(
            "{}: a torch.save file, which only a framework checkpoint (a Lightning .ckpt stored by TpdeCheckpointIO, \
             a Checkpointer step) unpacks to; {python}. This command writes .safetensors",
            output.display()
        )
    })
}

/// The error of a GPU command in a build without the GPU decoder.
#[cfg(not(feature = "gpu"))]
fn no_gpu() -> CliError {
    CliError::usage(
        "this tpde was built without the GPU decoder (the tpde that `pip install` brings); \
         `cargo install --path crates/tpde-cli` builds one with it",
    )
}

/// Prints clap's message (--help and --version are "errors" that print to stdout and exit 0)
/// and returns its exit status.
fn usage_exit(e: clap::Error) -> u8 {
    let _ = e.print();
    e.exit_code().clamp(0, 255) as u8
}

/// Runs `tpde ARGS` (`args` starts with the program's name) and returns its exit status.
pub fn tpde<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => exit_code(run(cli.command), "tpde"),
        Err(e) => usage_exit(e),
    }
}

fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Pack { input, output, base, codec } => {
            let options = codec.options()?;
            let base_ck = base.as_ref().map(open::open_base).transpose()?;
            let job = PackJob {
                base: base_ck.as_deref().zip(base.as_ref()).map(|(b, at)| (b, output.hint_to(at))),
                max_abs_error: codec.max_abs_error,
                max_rel_error: codec.max_rel_error,
                ..PackJob::keyframe(options)
            };
            let hint = job.base.as_ref().map(|(_, hint)| hint.clone());
            let bar = progress_bar(0, "packing");
            let r = tpde::pack(PackSource::Path(&input), &output, job, &bar)?.report;
            eprintln!("{}", pack_line(&r));
            if let Some(note) = hint.and_then(|h| open::hint_note(&output, &h)) {
                eprintln!("note: {note}");
            }
            Ok(())
        }
        Command::PackSeries { dir, output, keyframe_every, codec } => {
            let options = codec.options()?;
            let bar = progress_bar(0, "packing");
            let (abs, rel) = (codec.max_abs_error, codec.max_rel_error);
            let done = series::pack_series(&dir, &output, keyframe_every, options, abs, rel, &bar)?;
            for e in &done {
                let kind = if e.keyframe { "keyframe" } else { "delta" };
                outln!("{} -> {} ({kind}): {}", e.input.display(), e.output, pack_line(&e.report))?;
            }
            Ok(())
        }
        Command::Unpack { input, output, base, replace, gpu, read } => {
            if let Some(why) = framework_unpack(&input, &output) {
                return Err(CliError::usage(why));
            }
            let (bar, opts) = (progress_bar(0, "unpacking"), read.options());
            let r = match gpu {
                true if unpack::unpacks_to_folder(&input, &output)? => {
                    return Err(CliError::usage("--gpu unpacks to one file: give an output ending in .safetensors"));
                }
                #[cfg(feature = "gpu")]
                true => crate::gpu_unpack::unpack_gpu(&input, base.as_ref(), &output, &opts, &bar)?,
                #[cfg(not(feature = "gpu"))]
                true => return Err(no_gpu()),
                false => unpack::unpack_with(&input, base.as_ref(), &output, &opts, replace, &bar)
                    .map_err(|e| CliError::from(e).about(&input))?,
            };
            eprintln!(
                "unpacked {} tensors ({}) in {:.2} s, {:.0} MB/s",
                r.tensors,
                HumanBytes(r.logical_bytes),
                r.seconds,
                mb_per_s(r.logical_bytes, r.seconds)
            );
            Ok(())
        }
        Command::Verify { file, base, against, read } => {
            if let Some(folder) = file.as_path().filter(|p| p.is_dir()) {
                if base.is_some() || against.is_some() {
                    return Err(CliError::usage(format!(
                        "{file}: a folder is checked file by file; --base and --against take one file"
                    )));
                }
                return verify_folder(folder, &read.options());
            }
            verify(&file, base.as_ref(), &read.options())?;
            if let Some(orig) = against {
                let rep = against::verify_against(&file, base.as_ref(), &orig)?;
                match rep.bound {
                    None => outln!("ok: all {} tensors bit-exact against {}", rep.tensors, orig.display())?,
                    Some(b) => outln!(
                        "ok: {} tensors within the recorded bound {} of {} ({} bit-exact), max abs error {:e}",
                        rep.tensors,
                        bound_text(b),
                        orig.display(),
                        rep.identical,
                        rep.max_abs_error
                    )?,
                }
            }
            Ok(())
        }
        Command::Cp { from, to } => {
            let start = Instant::now();
            let bytes = tpde::location::copy(&from, &to)?;
            let secs = start.elapsed().as_secs_f64();
            eprintln!("copied {} in {secs:.2} s, {:.0} MB/s", HumanBytes(bytes), mb_per_s(bytes, secs));
            Ok(())
        }
        Command::Cat { file, tensor, read } => {
            // Streamed a window of chunks at a time: memory stays bounded whatever the tensor's size.
            let r = open::open_tpde_with(&file, None, &read.options())?;
            let t = r.tensor(&tensor).map_err(|e| tpde::Error::from(e).context(&file))?;
            let mut out = std::io::stdout().lock();
            let written = r.stream_tensor(t, |bytes| out.write_all(bytes).map_err(CatError::Write));
            match written.and_then(|()| out.flush().map_err(CatError::Write)) {
                Err(CatError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(CatError::Write(e)) => Err(e.into()),
                Err(CatError::Read(e)) => Err(tpde::Error::from(e).context(&file).into()),
                Ok(()) => Ok(()),
            }
        }
        Command::Inspect(a) => crate::run_inspect(&a.file, a.json, a.chunks, a.full),
        Command::Conformance { dir, quiet, gpu } => {
            let outcomes = if gpu {
                #[cfg(feature = "gpu")]
                {
                    let gpu = tpde_gpu::Gpu::new()?;
                    eprintln!("decoding on {} ({:?})", gpu.info().name, gpu.info().backend);
                    conformance::run_on(&dir, conformance::Backend::Gpu(&gpu))
                }
                #[cfg(not(feature = "gpu"))]
                return Err(no_gpu());
            } else {
                conformance::run(&dir)
            }
            .map_err(CliError::failed)?;
            out!("{}", conformance::render(&outcomes, quiet))?;
            match outcomes.iter().any(|o| o.failure.is_some()) {
                true => Err(CliError::failed("conformance: some files failed")),
                false => Ok(()),
            }
        }
        Command::ConformanceRead { file, base, follow_hints } => {
            outln!("{}", conformance::read_one_json(&file, &base, follow_hints))?;
            Ok(())
        }
        Command::Demo { dir } => demo::run(dir),
        #[cfg(feature = "gpu")]
        Command::BenchGpu { input, base, runs, demo_mb, decades } => {
            let gpu = tpde_gpu::Gpu::new()?;
            let (work, _keep) = demo::workdir(None)?;
            let (input, base) = match input {
                Some(p) => (p, base),
                None => {
                    let (p, b) = (work.join("demo.safetensors"), work.join("demo.base.safetensors"));
                    let model =
                        demo_mb.map_or_else(demo::DemoModel::default, |mb| demo::DemoModel::sized(mb * 1_000_000));
                    demo::write_checkpoint(model, 1000, 7, &p)?;
                    demo::write_checkpoint(model, 990, 7, &b)?;
                    (p, Some(b))
                }
            };
            let mut rows = crate::gpu_bench::run(&gpu, &input, base.as_deref(), runs.max(1))?;
            if let Some(mb) = decades {
                rows.extend(crate::gpu_bench::decades(&gpu, mb.max(1) * 1_000_000, runs.max(1), &work)?);
            }
            out!("{}", crate::gpu_bench::render(&gpu, &input, &rows, runs.max(1)))?;
            Ok(())
        }
        #[cfg(not(feature = "gpu"))]
        Command::BenchGpu { .. } => Err(no_gpu()),
        Command::Bench { mut inputs, runs, dir } => {
            let (work, _keep) = demo::workdir(dir)?;
            if inputs.is_empty() {
                let p = work.join("demo.safetensors");
                demo::write_checkpoint(demo::DemoModel::default(), 1000, 7, &p)?;
                inputs.push(p);
            }
            let rows = bench::run(&inputs, &work, runs.max(1))?;
            let input = &inputs[0];
            out!("{}", bench::render(input, &rows, runs.max(1)))?;
            Ok(())
        }
    }
}

/// A lossy bound as `verify --against` reports it: `1e-4`, `1e-3·|x|` or `1e-4 + 1e-3·|x|`.
fn bound_text(b: tpde::write::lossy::Bound) -> String {
    match (b.abs, b.rel) {
        (abs, 0.0) => format!("{abs:e}"),
        (0.0, rel) => format!("{rel:e}·|x|"),
        (abs, rel) => format!("{abs:e} + {rel:e}·|x|"),
    }
}

/// A command-line path or URL.
fn location(s: &str) -> Result<Location, String> {
    Location::parse(s).map_err(|e| e.to_string())
}

fn pack_line(r: &PackReport) -> String {
    let files = match (r.files, r.skipped_files) {
        (0, 0) => String::new(),
        (n, 0) => format!(" and {n} files"),
        (n, s) => format!(" and {n} files ({s} left out: weights in other formats, hidden folders)"),
    };
    // Which links were read through, so that a user sees what left the folder's own bytes.
    let links: String =
        r.links.iter().map(|(path, target)| format!("\n  {path}: a link, read from {}", target.display())).collect();
    format!(
        "packed {} tensors ({} as deltas){files}: {} -> {} (ratio {:.3}) in {:.2} s, {:.0} MB/s{links}",
        r.tensors,
        r.delta_tensors,
        HumanBytes(r.logical_bytes),
        HumanBytes(r.file_bytes),
        ratio(r.stored_bytes, r.logical_bytes),
        r.seconds,
        mb_per_s(r.logical_bytes, r.seconds)
    )
}

/// Why `cat` stopped: the file, or the output.
enum CatError {
    Read(tpde::read::ReadError),
    Write(std::io::Error),
}

impl From<tpde::read::ReadError> for CatError {
    fn from(e: tpde::read::ReadError) -> Self {
        CatError::Read(e)
    }
}

pub(crate) fn verify(file: &Location, base: Option<&Location>, opts: &open::OpenOptions) -> Result<(), CliError> {
    let r = open::open_tpde_with(file, base, opts)?;
    let bar = progress_bar(r.tensors().iter().map(|t| t.byte_length).sum(), "verifying");
    let report = r.verify_with(|t| bar.0.inc(t.byte_length)).map_err(|e| tpde::Error::from(e).context(file))?;
    bar.0.finish_and_clear();
    outln!(
        "ok: {} tensors, {} chunks, {} logical, {} stored; content digest {}",
        report.tensors,
        report.chunks,
        HumanBytes(report.logical_bytes),
        HumanBytes(report.stored_bytes),
        tpde::format::digest::to_hex(&r.content_digest())
    )?;
    Ok(())
}

/// `tpde verify FOLDER`: every TPDE file under it, with the base it needs.
fn verify_folder(folder: &std::path::Path, opts: &open::OpenOptions) -> Result<(), CliError> {
    let checks = tpde::verify::verify_folder(folder, opts)?;
    if checks.is_empty() {
        return Err(CliError::failed(format!("{}: no TPDE file in this folder or below it", folder.display())));
    }
    let failed = checks.iter().filter(|c| c.result.is_err()).count();
    for c in &checks {
        let needs = c.base.as_deref().map_or("keyframe".to_owned(), |b| format!("needs {b}"));
        match &c.result {
            Ok(r) => outln!("ok      {}  ({needs}; {} tensors)", c.path.display(), r.tensors)?,
            Err(e) => outln!("FAILED  {}  ({needs}): {}: {e}", c.path.display(), e.kind())?,
        }
    }
    match failed {
        0 => outln!("ok: {} files, every chain whole", checks.len()),
        n => Err(CliError::failed(format!("{}: {n} of {} files do not load", folder.display(), checks.len()))),
    }
}

//! `tpde bench`: pack and unpack throughput on one safetensors file, single-threaded and on
//! all cores, side by side with the tools a user would otherwise reach for, in the same run,
//! like compared with like:
//!
//! - file to file: `tpde pack` / `tpde unpack` next to the `zstd` command line (`-3`, `-d`);
//! - in memory: reading every tensor of a `.tpde` next to decompressing the whole file with the
//!   zstd library in-process, and next to copying every tensor out of a mapped safetensors file.
//!
//! Every figure is the median of `runs` wall-clock timings with the page cache warm, in MB/s
//! (10^6 bytes) of the logical tensor bytes (for zstd, of the input file's bytes). One-thread
//! rows run pinned to one CPU (on Linux), child processes included: an unpinned `zstd -T1`
//! uses more than one CPU. Outputs go to the directory given (use a tmpfs such as /dev/shm to
//! measure codecs rather than disks).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use safetensors::SafeTensors;
use tpde::codec::Encoder;
use tpde::read::Reader;
use tpde::write::WriteOptions;

use tpde::{PackJob, PackReport, PackSource};

use crate::{mb_per_s, ratio, CliError};

/// One row of the results table.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// Threads used (0 = zstd's own -T0).
    pub threads: usize,
    /// Output bytes / input bytes, where it applies.
    pub ratio: Option<f64>,
    /// Median MB/s.
    pub mb_s: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn time(runs: usize, mut f: impl FnMut() -> Result<(), CliError>) -> Result<f64, CliError> {
    f()?; // warm-up: page cache, allocator, thread pool
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

/// Reads one byte per page, so a borrowed (zero-copy) result is really faulted in and no
/// result can be optimised away.
fn touch(data: &[u8]) {
    std::hint::black_box(data.iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>());
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool")
}

/// Runs `f` with the calling thread pinned to one CPU when `threads` is 1 (threads and
/// processes it starts inherit that), then restores the thread's CPUs.
#[cfg(target_os = "linux")]
fn pinned<T>(threads: usize, f: impl FnOnce() -> T) -> T {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let Some(all) = (threads == 1).then(|| sched_getaffinity(None).ok()).flatten() else { return f() };
    let Some(cpu) = (0..CpuSet::MAX_CPU).find(|&c| all.is_set(c)) else { return f() };
    let mut one = CpuSet::new();
    one.set(cpu);
    let _ = sched_setaffinity(None, &one);
    let out = f();
    let _ = sched_setaffinity(None, &all);
    out
}

#[cfg(not(target_os = "linux"))]
fn pinned<T>(_threads: usize, f: impl FnOnce() -> T) -> T {
    f()
}

fn zstd_cli(args: &[&str], input: &Path, output: &Path) -> Result<(), CliError> {
    let status = Command::new("zstd")
        .args(args)
        .arg("-q")
        .arg("-f")
        .arg(input)
        .arg("-o")
        .arg(output)
        .status()
        .map_err(|e| CliError::failed(format!("running zstd: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(CliError::failed(format!("zstd {args:?} failed: {status}")))
    }
}

/// Runs `f` at each thread count of `threads_list` (1: pinned to one CPU) with a pool of that
/// many threads.
fn each(
    threads_list: &[usize],
    mut f: impl FnMut(usize, &rayon::ThreadPool) -> Result<(), CliError>,
) -> Result<(), CliError> {
    for &threads in threads_list {
        pinned(threads, || f(threads, &pool(threads)))?;
    }
    Ok(())
}

/// Reads every tensor of `r` into buffers allocated for it (as a restore does), in one
/// parallel pass ([`Reader::read_many_into`]), and touches the result.
fn read_all<S: tpde::read::Source + Send>(r: &Reader<S>) -> Result<(), CliError> {
    let mut bufs = buffers(r);
    read_all_into(r, &mut bufs)?;
    bufs.iter().for_each(|b| touch(b));
    Ok(())
}

/// A zeroed buffer for every tensor of `r`.
fn buffers<S: tpde::read::Source>(r: &Reader<S>) -> Vec<Vec<u8>> {
    r.tensors().iter().map(|t| vec![0u8; t.byte_length as usize]).collect()
}

/// Reads every tensor of `r` into `bufs` (from [`buffers`]) in one parallel pass.
fn read_all_into<S: tpde::read::Source + Send>(r: &Reader<S>, bufs: &mut [Vec<u8>]) -> Result<(), CliError> {
    Ok(r.read_many_into(r.tensors().iter().zip(bufs.iter_mut().map(|b| &mut b[..])).collect())?)
}

/// Runs the benchmark on `inputs` (safetensors checkpoints of one run, oldest first): the first
/// as a keyframe; with two or more, each later one also as a delta on the one before, a chain;
/// returns the rows.
pub fn run(inputs: &[PathBuf], workdir: &Path, runs: usize) -> Result<Vec<Row>, CliError> {
    let input = inputs.first().ok_or_else(|| CliError::usage("bench needs a checkpoint".to_string()))?;
    let all = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let file_bytes = std::fs::metadata(input)?.len();
    let out = |name: &str| -> PathBuf { workdir.join(name) };
    let mut rows = Vec::new();
    let mut logical = 0u64;

    let mut threads_list = vec![1];
    if all > 1 {
        threads_list.push(all);
    }
    for (label, encoder) in [("raw", Encoder::Raw), ("zstd -3", Encoder::Zstd { level: 3 }), ("auto", Encoder::Auto)] {
        let packed = out("bench.tpde");
        each(&threads_list, |threads, p| {
            let mut report = PackReport::default();
            let secs = time(runs, || {
                report = p
                    .install(|| {
                        tpde::pack(
                            PackSource::Path(input),
                            &packed.clone().into(),
                            PackJob::keyframe(WriteOptions { encoder, ..WriteOptions::default() }),
                            &(),
                        )
                    })?
                    .report;
                Ok(())
            })?;
            logical = report.logical_bytes;
            rows.push(Row {
                what: format!("tpde pack --codec {}", label.split(' ').next().unwrap_or(label)),
                threads,
                ratio: Some(ratio(report.file_bytes, file_bytes)),
                mb_s: mb_per_s(report.logical_bytes, secs),
            });
            let unpacked = out("bench.unpacked.safetensors");
            let secs = time(runs, || {
                p.install(|| {
                    tpde::unpack(&packed.clone().into(), None, &unpacked, &()).map(|_| ()).map_err(CliError::from)
                })
            })?;
            rows.push(Row {
                what: format!("tpde unpack ({label} file)"),
                threads,
                ratio: None,
                mb_s: mb_per_s(logical, secs),
            });
            let secs = time(runs, || p.install(|| read_all(&Reader::open(&packed)?)))?;
            rows.push(Row {
                what: format!("tpde read all tensors ({label} file, CRC on, in memory)"),
                threads,
                ratio: None,
                mb_s: mb_per_s(logical, secs),
            });
            if encoder == Encoder::Auto {
                // Into memory that already exists (a model's parameters: `load_into`), so no
                // page is faulted in and zeroed while timed.
                let mut bufs = buffers(&Reader::open(&packed)?);
                // The warm-up run of `time` writes every buffer before the timed ones.
                let secs = time(runs, || p.install(|| read_all_into(&Reader::open(&packed)?, &mut bufs)))?;
                rows.push(Row {
                    what: format!("tpde read all tensors ({label} file, CRC on, into existing buffers as load_into)"),
                    threads,
                    ratio: None,
                    mb_s: mb_per_s(logical, secs),
                });
            }
            Ok(())
        })?;
    }
    // `bench.tpde` is now the `auto` keyframe of the first checkpoint.
    if inputs.len() > 1 {
        rows.extend(chain(inputs, workdir, runs, &threads_list)?);
    }

    // zstd in-process, one thread: the whole file at level 3, compressed and decompressed in
    // memory, like `tpde read all` (the CLI rows below are file to file, like pack and unpack).
    let original = std::fs::read(input)?;
    pinned(1, || -> Result<(), CliError> {
        let mut compressed = Vec::new();
        let secs = time(runs, || {
            compressed = zstd::bulk::compress(&original, 3)?;
            Ok(())
        })?;
        rows.push(Row {
            what: "zstd -3 (library, whole file, in memory)".into(),
            threads: 1,
            ratio: Some(ratio(compressed.len() as u64, file_bytes)),
            mb_s: mb_per_s(file_bytes, secs),
        });
        let secs = time(runs, || {
            touch(&zstd::bulk::decompress(&compressed, original.len())?);
            Ok(())
        })?;
        rows.push(Row {
            what: "zstd decode (library, whole file, in memory: compare with tpde read all)".into(),
            threads: 1,
            ratio: None,
            mb_s: mb_per_s(file_bytes, secs),
        });
        Ok(())
    })?;

    let secs = pinned(1, || {
        time(runs, || {
            let map = tpde::read::map_file(input)?;
            let st = SafeTensors::deserialize(&map).map_err(|e| CliError::failed(e.to_string()))?;
            for (_, t) in st.tensors() {
                // The copy is the point: it is what a loader does to get an owned tensor.
                let owned: Vec<u8> = t.data().to_vec();
                touch(&owned);
            }
            Ok(())
        })
    })?;
    rows.push(Row {
        what: "safetensors load (mmap + copy each tensor)".into(),
        threads: 1,
        ratio: None,
        mb_s: mb_per_s(logical, secs),
    });

    if Command::new("zstd").arg("--version").output().is_ok() {
        let z = out("bench.safetensors.zst");
        let mut threads_list = vec![("-T1", 1)];
        if all > 1 {
            threads_list.push(("-T0", all));
        }
        for (flag, threads) in threads_list {
            let secs = pinned(threads, || time(runs, || zstd_cli(&["-3", flag], input, &z)))?;
            let zr = ratio(std::fs::metadata(&z)?.len(), file_bytes);
            rows.push(Row {
                what: "zstd -3 (CLI, whole file, file to file: compare with tpde pack)".into(),
                threads,
                ratio: Some(zr),
                mb_s: mb_per_s(file_bytes, secs),
            });
        }
        let d = out("bench.zstd-d.safetensors");
        let secs = pinned(1, || time(runs, || zstd_cli(&["-d"], &z, &d)))?;
        rows.push(Row {
            what: "zstd -d (CLI, whole file, file to file: compare with tpde unpack)".into(),
            threads: 1,
            ratio: None,
            mb_s: mb_per_s(file_bytes, secs),
        });
    } else {
        eprintln!("note: no `zstd` on PATH; the zstd CLI rows are left out");
    }
    rows.extend(zipnn(input, runs, &threads_list)?);
    for f in ["bench.tpde", "bench.unpacked.safetensors", "bench.safetensors.zst", "bench.zstd-d.safetensors"] {
        let _ = std::fs::remove_file(out(f));
    }
    Ok(rows)
}

/// Deltas and chains: each checkpoint after the first packed (`auto`) against the file of the one
/// before (`bench.tpde`, the first's keyframe, then `bench.delta-N.tpde`), its pack timed with
/// the base's decode, its digests and estimates included; then restoring each step of the chain
/// into memory, every step once per round: a delta chunk takes its base's chunk through the
/// whole chain, one chunk at a time. Restore rows give the time against one keyframe decode on
/// the same threads.
fn chain(inputs: &[PathBuf], workdir: &Path, runs: usize, threads_list: &[usize]) -> Result<Vec<Row>, CliError> {
    let mut rows = Vec::new();
    let mut files = vec![workdir.join("bench.tpde")];
    for (k, input) in inputs.iter().enumerate().skip(1) {
        let output = workdir.join(format!("bench.delta-{k}.tpde"));
        let base_path = &files[k - 1];
        let pack = || -> Result<PackReport, CliError> {
            let base = tpde::open::open_base(&base_path.clone().into())?;
            let hint = base_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let options = WriteOptions { encoder: Encoder::Auto, ..WriteOptions::default() };
            let job = PackJob { base: Some((&*base, hint)), ..PackJob::keyframe(options) };
            Ok(tpde::pack(PackSource::Path(input), &output.clone().into(), job, &())?.report)
        };
        if k > 1 {
            // Only the first delta is timed; the rest of the chain is packed once.
            pack()?;
        } else {
            let file_bytes = std::fs::metadata(input)?.len();
            each(threads_list, |threads, p| {
                let mut report = PackReport::default();
                let secs = time(runs, || {
                    report = p.install(pack)?;
                    Ok(())
                })?;
                rows.push(Row {
                    what: "tpde pack delta (auto, its base's decode included)".into(),
                    threads,
                    ratio: Some(ratio(report.file_bytes, file_bytes)),
                    mb_s: mb_per_s(report.logical_bytes, secs),
                });
                Ok(())
            })?;
        }
        files.push(output);
    }
    each(threads_list, |threads, p| {
        // Every step of the chain is restored once per round, the rounds one after another, so
        // that the machine's drift over minutes (a shared VM's speed moves by a quarter) falls
        // on every step alike; a link's own cost is the median of its paired differences with
        // the step before, in the same rounds.
        let restore = |file: &PathBuf| -> Result<(f64, u64), CliError> {
            p.install(|| {
                let s = Instant::now();
                let r = tpde::open::open_chain(&file.clone().into())?;
                read_all(&r)?;
                Ok((s.elapsed().as_secs_f64(), r.tensors().iter().map(|t| t.byte_length).sum()))
            })
        };
        for file in &files {
            restore(file)?; // warm-up: page cache, allocator, thread pool
        }
        let mut secs = vec![Vec::with_capacity(runs); files.len()];
        let mut logical = vec![0; files.len()];
        for _ in 0..runs {
            for (k, file) in files.iter().enumerate() {
                let (t, bytes) = restore(file)?;
                secs[k].push(t);
                logical[k] = bytes;
            }
        }
        let keyframe_secs = median(secs[0].clone());
        for (k, times) in secs.iter().enumerate() {
            let t = median(times.clone());
            rows.push(Row {
                what: match k {
                    0 => "restore keyframe (read all, in memory)".to_string(),
                    // The last link's own speed: what the delta adds to the restore of its
                    // base (noise can make the median difference non-positive: then "-").
                    k => format!(
                        "restore keyframe + {k} delta{} ({:.2}x one keyframe's time; the last delta adds {})",
                        if k == 1 { "" } else { "s" },
                        t / keyframe_secs,
                        match median(times.iter().zip(&secs[k - 1]).map(|(a, b)| a - b).collect()) {
                            d if d > 0.0 => format!("{:.0} MB/s", mb_per_s(logical[k], d)),
                            _ => "-".into(),
                        }
                    ),
                },
                threads,
                ratio: None,
                mb_s: mb_per_s(logical[k], t),
            });
        }
        Ok(())
    })?;
    for f in &files[1..] {
        let _ = std::fs::remove_file(f);
    }
    Ok(rows)
}

/// ZipNN (the Python package), when the Python on `TPDE_BENCH_PYTHON` (default `python3`) has
/// it: every float tensor of `input` compressed and decompressed in memory through its byte API,
/// one thread pinned and all threads, timed like the rows above (a warm-up, then the median).
fn zipnn(input: &Path, runs: usize, threads_list: &[usize]) -> Result<Vec<Row>, CliError> {
    const SCRIPT: &str = r#"
import json, statistics, struct, sys, time
import zipnn
path, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kinds = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# The tensors' bytes straight from the safetensors layout (u64 header length, JSON header, data):
# numpy has no bfloat16 of its own, so safetensors.numpy cannot load a bf16 checkpoint.
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header, data = json.loads(f.read(n)), f.read()
tensors = [(t["dtype"], data[t["data_offsets"][0]:t["data_offsets"][1]]) for k, t in header.items() if k != "__metadata__"]
def once():
    coders, tc, td, stored, ok = {}, 0.0, 0.0, 0, True
    for dt, b in tensors:
        if dt not in kinds or not b:
            stored += len(b)
            continue
        z = coders.setdefault(dt, zipnn.ZipNN(input_format="byte", bytearray_dtype=kinds[dt], threads=threads))
        # A copy: ZipNN 0.5.4's compress reorders its input's bytes in place, so every run after
        # the first compressed scrambled bytes and the round trip compared with them.
        src = bytearray(b)
        t = time.perf_counter(); c = z.compress(src); tc += time.perf_counter() - t
        t = time.perf_counter(); d = z.decompress(c); td += time.perf_counter() - t
        stored += len(c); ok &= bytes(d) == b
    return tc, td, stored, ok
once()
rs = [once() for _ in range(runs)]
print(json.dumps({"compress": statistics.median(r[0] for r in rs), "decompress": statistics.median(r[1] for r in rs),
                  "stored": rs[0][2], "logical": sum(len(b) for _, b in tensors), "exact": all(r[3] for r in rs)}))
"#;
    let python = std::env::var("TPDE_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python).args(["-c", "import zipnn"]).output();
    if !has.is_ok_and(|o| o.status.success()) {
        eprintln!("note: {python} has no zipnn (pip install zipnn); the ZipNN rows are left out");
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    for &threads in threads_list {
        let out = pinned(threads, || {
            Command::new(&python)
                .args(["-c", SCRIPT])
                .arg(input)
                .args([if threads == 1 { "1" } else { "0" }.to_string(), runs.to_string()])
                .output()
        })
        .map_err(|e| CliError::failed(format!("running {python}: {e}")))?;
        if !out.status.success() {
            return Err(CliError::failed(format!("ZipNN run failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| CliError::failed(format!("ZipNN run printed no result ({e})")))?;
        let num = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let logical = num("logical") as u64;
        let exact = if v["exact"].as_bool() == Some(true) { "" } else { ", round trip NOT bit-exact" };
        rows.push(Row {
            what: format!("ZipNN compress (per tensor, in memory{exact})"),
            threads,
            ratio: Some(num("stored") / num("logical")),
            mb_s: mb_per_s(logical, num("compress")),
        });
        rows.push(Row {
            what: format!("ZipNN decompress (per tensor, in memory{exact})"),
            threads,
            ratio: None,
            mb_s: mb_per_s(logical, num("decompress")),
        });
    }
    Ok(rows)
}

/// The rows as a Markdown table, headed by the input and the machine.
pub fn render(input: &Path, rows: &[Row], runs: usize) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let mut s = format!(
        "{} ({} bytes), median of {runs} runs; {} cores available ({cpu}; rANS lanes decoded with {})\n\n| operation | threads | size ratio | MB/s |\n|---|---:|---:|---:|\n",
        input.display(),
        std::fs::metadata(input).map(|m| m.len()).unwrap_or(0),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        tpde::codec::rans::lane_loop()
    );
    for r in rows {
        let ratio = r.ratio.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
        // Two decimals below 10 MB/s (tiny inputs, as in the tests), so that a slow row of a
        // loaded machine never reads as 0.
        let mb_s = if r.mb_s < 10.0 { format!("{:.2}", r.mb_s) } else { format!("{:.0}", r.mb_s) };
        s.push_str(&format!("| {} | {} | {} | {} |\n", r.what, r.threads, ratio, mb_s));
    }
    s
}

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
use tpde_codec::Encoder;
use tpde_read::Reader;
use tpde_write::WriteOptions;

use crate::convert::PackJob;
use crate::{convert, mb_per_s, ratio, CliError};

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

/// Runs the benchmark; returns the rows.
pub fn run(input: &Path, workdir: &Path, runs: usize) -> Result<Vec<Row>, CliError> {
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
        for &threads in &threads_list {
            pinned(threads, || -> Result<(), CliError> {
                let p = pool(threads);
                let mut report = convert::PackReport::default();
                let secs = time(runs, || {
                    report = p.install(|| {
                        convert::pack(
                            input,
                            &packed.clone().into(),
                            PackJob::keyframe(WriteOptions { encoder, ..WriteOptions::default() }),
                            &(),
                        )
                    })?;
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
                        convert::unpack(&packed.clone().into(), None, &unpacked, &())
                            .map(|_| ())
                            .map_err(CliError::from)
                    })
                })?;
                rows.push(Row {
                    what: format!("tpde unpack ({label} file)"),
                    threads,
                    ratio: None,
                    mb_s: mb_per_s(logical, secs),
                });
                let secs = time(runs, || {
                    p.install(|| {
                        let r = Reader::open(&packed)?;
                        for t in r.tensors() {
                            touch(&r.read_tensor(t)?);
                        }
                        Ok(())
                    })
                })?;
                rows.push(Row {
                    what: format!("tpde read all tensors ({label} file, CRC on, in memory)"),
                    threads,
                    ratio: None,
                    mb_s: mb_per_s(logical, secs),
                });
                Ok(())
            })?;
        }
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
            let map = tpde_read::map_file(input)?;
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
    for f in ["bench.tpde", "bench.unpacked.safetensors", "bench.safetensors.zst", "bench.zstd-d.safetensors"] {
        let _ = std::fs::remove_file(out(f));
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn render(input: &Path, rows: &[Row], runs: usize) -> String {
    let mut s = format!(
        "{} ({} bytes), median of {runs} runs, {} cores available\n\n| operation | threads | size ratio | MB/s |\n|---|---:|---:|---:|\n",
        input.display(),
        std::fs::metadata(input).map(|m| m.len()).unwrap_or(0),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    for r in rows {
        let ratio = r.ratio.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
        s.push_str(&format!("| {} | {} | {} | {:.0} |\n", r.what, r.threads, ratio, r.mb_s));
    }
    s
}

//! What the measuring examples (`plane_records`, `context_records`, `keyframe_planes`) share:
//! the chunk size and timing rule, the float tensors two checkpoints have in common, and where a
//! plane record ends. Each example uses what it needs of it.
#![allow(dead_code)]

pub mod huffman;

use std::time::Instant;

use tpde::codec::planes::PlaneRecord;
use tpde::safetensors::SafetensorsFile;
use tpde::DType;

/// Chunk length, as `tpde pack` cuts tensors.
pub const CHUNK: usize = 4 << 20;
/// Timed runs of each decode; the best counts.
pub const RUNS: usize = 15;

/// Best of [`RUNS`] wall times of `f`, in seconds.
pub fn best(mut f: impl FnMut()) -> f64 {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The bf16 and f32 tensors of `new` of at least 4 KiB that `base` has with the same dtype
/// and shape: (name, dtype, new bytes, base bytes).
pub fn common_floats<'a>(
    new: &'a SafetensorsFile,
    base: &'a SafetensorsFile,
) -> Vec<(&'a str, DType, &'a [u8], &'a [u8])> {
    let base_of: std::collections::HashMap<&str, (DType, &[u64], &[u8])> =
        base.tensors().map(|(n, d, s, b)| (n, (d, s, b))).collect();
    new.tensors()
        .filter_map(|(name, dtype, shape, data)| {
            let &(bd, bs, bdata) = base_of.get(name)?;
            (bd == dtype && bs == shape && matches!(dtype, DType::BF16 | DType::F32) && data.len() >= 4096)
                .then_some((name, dtype, data, bdata))
        })
        .collect()
}

/// The two checkpoints named on the command line, or a usage error naming `example`.
pub fn open_pair(example: &str) -> Result<(SafetensorsFile, SafetensorsFile), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [new, base] = &args[..] else {
        return Err(format!("usage: {example} NEW.safetensors BASE.safetensors").into());
    };
    Ok((SafetensorsFile::open(new.as_ref())?, SafetensorsFile::open(base.as_ref())?))
}

/// The offset just past `record` in its chunk's stored bytes (of `n` symbols).
pub fn end_of(record: &PlaneRecord, n: usize) -> usize {
    match record {
        PlaneRecord::Stored(at) => at + n,
        PlaneRecord::Serial(_, stream) => stream.end,
        PlaneRecord::Lanes(_, l) | PlaneRecord::Contexts(_, l) | PlaneRecord::BaseContexts(_, l) => l.bytes.end,
        PlaneRecord::Sparse(sparse) => end_of(&sparse.values, sparse.count),
        PlaneRecord::Blocks(_, l) | PlaneRecord::BaseContextBlocks(_, l) | PlaneRecord::ContextBlocks(_, l) => {
            l.words.end
        }
    }
}

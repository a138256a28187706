//! What rANS block records (spec §6.2.6, format 1.10) buy a keyframe: on real checkpoints,
//! every bf16 and f32 tensor's exponent plane (the top plane of the `planes` transform) as an
//! order-0 lane record (§6.2.3) and as a block record, with the block decoder's scalar, AVX2 and
//! AVX-512 loops, and as the Huffman prototype issue 55 weighed against them
//! (`measure/huffman.rs`); and each chunk as `auto` codes it in a 1.9 file and in a 1.10 one.
//! Sizes, decode speeds on one core (best of 15 runs, the chunk in cache) and the chunks' encode
//! speed (best of 3).
//!
//!     cargo run --release -p tpde --example block_records -- A.safetensors [B.safetensors ...]
//!     cargo run --release -p tpde --example block_records -- --deltas NEW.safetensors BASE.safetensors
//!
//! With `--deltas`: the top plane of the XOR delta between two checkpoints of a run (sign and
//! exponent bits, what a dense delta's planes code) in bits a symbol, as lanes, blocks and
//! Huffman: a Huffman code cannot go below one bit a symbol.

mod measure;

use measure::huffman::Huffman;
use measure::{best, CHUNK};
use tpde::codec::rans::{self, BlockLayout, BlockLoop, LaneLayout, Table};
use tpde::codec::{ChunkContext, Encoder};
use tpde::safetensors::SafetensorsFile;
use tpde::DType;

/// The top byte of each element rotated left by one bit: for bf16 and f32, the exponent.
fn exponent_plane(dtype: DType, data: &[u8]) -> Vec<u8> {
    let w = dtype.size() as usize;
    data.chunks_exact(w).map(|e| (e[w - 1] << 1) | (e[w - 2] >> 7)).collect()
}

#[derive(Default)]
struct Sums {
    symbols: u64,
    lanes_bytes: u64,
    blocks_bytes: u64,
    lanes_s: f64,
    /// Scalar, AVX2, AVX-512.
    blocks_s: [f64; 3],
    /// The Huffman prototype: its streams (128 bytes counted for a table of lengths).
    huffman_bytes: u64,
    huffman_s: f64,
    raw: u64,
    /// In a 1.9 file, then a 1.10 one.
    chunk_bytes: [u64; 2],
    chunk_s: [f64; 2],
    /// Encoding the chunks, best of 3.
    encode_s: [f64; 2],
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, new, base] = &paths[..] {
        if flag == "--deltas" {
            return deltas(new, base);
        }
    }
    if paths.is_empty() {
        return Err("usage: block_records A.safetensors [B.safetensors ...]".into());
    }
    let loops = [BlockLoop::Scalar, BlockLoop::Avx2, BlockLoop::Avx512];
    println!("| file | exp. symbols | lanes / blocks bytes | Huffman bytes | G symbols/s: lanes, blocks scalar, AVX2, AVX-512, Huffman | chunks 1.9 → 1.10 (of raw) | chunk decode GB/s 1.9 → 1.10 | encode GB/s 1.9 → 1.10 |");
    println!("|---|---:|---:|---:|---|---|---|---|");
    for path in &paths {
        let st = SafetensorsFile::open(path.as_ref())?;
        let mut s = Sums::default();
        for (_, dtype, _, data) in st.tensors() {
            if !matches!(dtype, DType::BF16 | DType::F32) || data.len() < 4096 {
                continue;
            }
            for chunk in data.chunks(CHUNK) {
                let plane = exponent_plane(dtype, chunk);
                let n = plane.len();
                let table = Table::from_histogram(&rans::histogram(&plane));
                let mut out = vec![0u8; n];
                let mut lanes = Vec::new();
                rans::encode_lanes(&table, &plane, &mut lanes);
                let layout = LaneLayout::read(&lanes, 0, n)?;
                s.lanes_s += best(|| rans::decode_lanes(&table, &lanes, &layout, &mut out).unwrap());
                let mut blocks = Vec::new();
                rans::encode_blocks(&table, &plane, &mut blocks);
                let layout = BlockLayout::read(&blocks, 0, n)?;
                for (k, l) in loops.into_iter().enumerate() {
                    out.fill(0);
                    rans::decode_blocks_with(&table, &blocks, &layout, &mut out, l)?;
                    assert_eq!(out, plane, "{l:?}: round trip");
                    s.blocks_s[k] += best(|| rans::decode_blocks_with(&table, &blocks, &layout, &mut out, l).unwrap());
                }
                let hist = rans::histogram(&plane);
                let huffman = Huffman::new(&hist);
                let streams = huffman.encode(&plane);
                huffman.decode(&streams, &mut out);
                assert_eq!(out, plane, "Huffman: round trip");
                s.huffman_s += best(|| huffman.decode(&streams, &mut out));
                s.huffman_bytes += 128 + streams.iter().map(|st| st.len() as u64 - 8).sum::<u64>();
                s.symbols += n as u64;
                s.lanes_bytes += lanes.len() as u64;
                s.blocks_bytes += blocks.len() as u64;
                // The chunk as `auto` writes a keyframe's in a 1.9 file and in a 1.10 one.
                let ctx = ChunkContext::keyframe(dtype);
                let mut back = vec![0u8; chunk.len()];
                for (k, minor) in [9, 10].into_iter().enumerate() {
                    let mut stored = Vec::new();
                    let (tag, params) = Encoder::Auto.encode_in(ctx, chunk, minor, &mut stored)?;
                    s.encode_s[k] += (0..3)
                        .map(|_| {
                            let t = std::time::Instant::now();
                            let mut again = Vec::with_capacity(stored.len());
                            Encoder::Auto.encode_in(ctx, chunk, minor, &mut again).unwrap();
                            t.elapsed().as_secs_f64()
                        })
                        .fold(f64::INFINITY, f64::min);
                    tpde::codec::decode(tag, ctx, &params, &stored, &mut back)?;
                    assert_eq!(back, chunk, "1.{minor}: round trip");
                    s.chunk_s[k] += best(|| tpde::codec::decode(tag, ctx, &params, &stored, &mut back).unwrap());
                    s.chunk_bytes[k] += stored.len() as u64;
                }
                s.raw += chunk.len() as u64;
            }
        }
        let g = |t: f64| s.symbols as f64 / t / 1e9;
        let name = std::path::Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        println!(
            "| {name} | {} | {} / {} ({:+.2}%) | {} ({:+.2}%) | {:.2}, {:.2}, {:.2}, {:.2}, {:.2} | {:.4} → {:.4} ({:+.2}%) | {:.2} → {:.2} | {:.2} → {:.2} |",
            s.symbols,
            s.lanes_bytes,
            s.blocks_bytes,
            100.0 * (s.blocks_bytes as f64 / s.lanes_bytes as f64 - 1.0),
            s.huffman_bytes,
            100.0 * (s.huffman_bytes as f64 / s.lanes_bytes as f64 - 1.0),
            g(s.lanes_s),
            g(s.blocks_s[0]),
            g(s.blocks_s[1]),
            g(s.blocks_s[2]),
            g(s.huffman_s),
            s.chunk_bytes[0] as f64 / s.raw as f64,
            s.chunk_bytes[1] as f64 / s.raw as f64,
            100.0 * (s.chunk_bytes[1] as f64 / s.chunk_bytes[0] as f64 - 1.0),
            s.raw as f64 / s.chunk_s[0] / 1e9,
            s.raw as f64 / s.chunk_s[1] / 1e9,
            s.raw as f64 / s.encode_s[0] / 1e9,
            s.raw as f64 / s.encode_s[1] / 1e9,
        );
    }
    Ok(())
}

/// The XOR delta's top plane of every common bf16 and f32 tensor of two checkpoints, in bits a
/// symbol as lanes, blocks and Huffman.
fn deltas(new: &str, base: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (new, base) = (SafetensorsFile::open(new.as_ref())?, SafetensorsFile::open(base.as_ref())?);
    let (mut symbols, mut bytes) = (0u64, [0u64; 3]);
    for (_, dtype, new, base) in measure::common_floats(&new, &base) {
        let xored: Vec<u8> = new.iter().zip(base).map(|(a, b)| a ^ b).collect();
        for chunk in xored.chunks(CHUNK) {
            let plane = exponent_plane(dtype, chunk);
            let hist = rans::histogram(&plane);
            let table = Table::from_histogram(&hist);
            let (mut lanes, mut blocks) = (Vec::new(), Vec::new());
            rans::encode_lanes(&table, &plane, &mut lanes);
            rans::encode_blocks(&table, &plane, &mut blocks);
            let huffman = Huffman::new(&hist).encode(&plane);
            let coded = [lanes.len(), blocks.len(), 128 + huffman.iter().map(|s| s.len() - 8).sum::<usize>()];
            for (b, c) in bytes.iter_mut().zip(coded) {
                *b += (c + table.encoded_len()) as u64;
            }
            symbols += plane.len() as u64;
        }
    }
    let bits = |b: u64| 8.0 * b as f64 / symbols as f64;
    println!(
        "delta top planes: {symbols} symbols; bits a symbol: lanes {:.3}, blocks {:.3}, Huffman {:.3}",
        bits(bytes[0]),
        bits(bytes[1]),
        bits(bytes[2])
    );
    Ok(())
}

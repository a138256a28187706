//! Where a keyframe's decode time goes: every chunk of a checkpoint coded by `auto` as a keyframe
//! and decoded whole on one core, and its top plane (sign and exponent, the plane both TPDE and
//! ZipNN entropy-code) timed alone: as `auto` wrote it (a neighbour-context lane record where
//! contexts pay, else order 0) and as an order-0 lane record. Prints sizes and times.
//!
//!     cargo run --release -p tpde --example keyframe_planes -- MODEL.safetensors

mod measure;

use measure::{best, end_of, CHUNK, RUNS};
use tpde::codec::planes::{self, PlaneRecord};
use tpde::codec::rans::{self, LaneLayout, Table};
use tpde::codec::{ChunkContext, Encoder};
use tpde::safetensors::SafetensorsFile;
use tpde::DType;

#[derive(Default)]
struct Sums {
    bytes: u64,
    chunk: f64,
    planes: u64,
    context_planes: u64,
    symbols: u64,
    /// As written, then as order-0 lanes.
    top: [f64; 2],
    top_bytes: [u64; 2],
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: keyframe_planes MODEL.safetensors")?;
    let file = SafetensorsFile::open(path.as_ref())?;
    let mut s = Sums::default();
    for (name, dtype, _, data) in file.tensors() {
        if !matches!(dtype, DType::BF16 | DType::F32) || data.len() < 4096 {
            continue;
        }
        let w = dtype.size() as usize;
        for chunk in data.chunks(CHUNK) {
            let n = chunk.len() / w;
            let ctx = ChunkContext::keyframe(dtype);
            let mut stored = Vec::new();
            let (tag, params) = Encoder::Auto.encode(ctx, chunk, &mut stored)?;
            let mut out = vec![0u8; chunk.len()];
            tpde::codec::decode(tag, ctx, &params, &stored, &mut out)?;
            s.chunk += best(|| tpde::codec::decode(tag, ctx, &params, &stored, &mut out).unwrap());
            s.bytes += stored.len() as u64;
            let (records, _) = planes::parse(tag, &stored, 0, w, n)?;
            let mut plane = vec![0u8; n];
            // The top plane's record as `auto` wrote it.
            match &records[w - 1] {
                PlaneRecord::Contexts(model, layout) => {
                    model.decode_lanes(&stored, layout, &mut plane)?;
                    s.top[0] += best(|| model.decode_lanes(&stored, layout, &mut plane).unwrap());
                    s.context_planes += 1;
                }
                PlaneRecord::Lanes(table, layout) => {
                    rans::decode_lanes(table, &stored, layout, &mut plane)?;
                    s.top[0] += best(|| rans::decode_lanes(table, &stored, layout, &mut plane).unwrap());
                }
                _ => continue,
            }
            s.planes += 1;
            s.symbols += n as u64;
            let start = records[..w - 1].last().map_or(0, |r| end_of(r, n));
            s.top_bytes[0] += (end_of(&records[w - 1], n) - start) as u64;
            // The same plane as an order-0 lane record.
            let hist = rans::histogram(&plane);
            let table = Table::from_histogram(&hist);
            let mut order0 = Vec::new();
            rans::encode_lanes(&table, &plane, &mut order0);
            let layout = LaneLayout::read(&order0, 0, n)?;
            let mut back = vec![0u8; n];
            rans::decode_lanes(&table, &order0, &layout, &mut back)?;
            assert_eq!(back, plane, "{name}: order 0");
            s.top[1] += best(|| rans::decode_lanes(&table, &order0, &layout, &mut back).unwrap());
            s.top_bytes[1] += 1 + order0.len() as u64 + 2 * hist.iter().filter(|&&c| c > 0).count() as u64;
            if std::env::var_os("KEYFRAME_PLANES_EACH").is_some() {
                let written = end_of(&records[w - 1], n) - start;
                let o0 = 1 + order0.len() + 2 * hist.iter().filter(|&&c| c > 0).count();
                println!("plane\t{name}\t{n}\t{}\t{written}\t{o0}", stored.len());
            }
        }
    }
    let ms = |x: f64| x * 1e3;
    println!(
        "whole chunks as `auto` codes a keyframe: {} bytes, decoded in {:.2} ms (one core, best of {RUNS} per chunk)",
        s.bytes,
        ms(s.chunk)
    );
    println!(
        "their top planes ({} of {} with neighbour contexts, {} symbols): {} bytes, decoded in {:.2} ms ({:.2} ns a symbol, {:.0}% of the chunks' time)",
        s.context_planes,
        s.planes,
        s.symbols,
        s.top_bytes[0],
        ms(s.top[0]),
        s.top[0] * 1e9 / s.symbols as f64,
        100.0 * s.top[0] / s.chunk
    );
    println!(
        "the same planes as order-0 lane records: {} bytes ({:+.2}% of the chunks), decoded in {:.2} ms ({:.2} ns a symbol)",
        s.top_bytes[1],
        100.0 * (s.top_bytes[1] as f64 - s.top_bytes[0] as f64) / s.bytes as f64,
        ms(s.top[1]),
        s.top[1] * 1e9 / s.symbols as f64
    );
    Ok(())
}

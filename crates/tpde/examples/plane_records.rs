//! What sparse plane records (spec §6.2.5, format 1.8) buy a delta: on real checkpoint pairs,
//! measures each dense delta chunk as `auto` codes it in a 1.7 file and in a 1.8 one (sparse
//! records allowed), and its top plane (the `planes` transform's sign and exponent) alone, as an
//! order-0 lane record and as a sparse record with either position coder: sizes (tables counted
//! at about 2 bytes a symbol) and decode times on one core.
//!
//!     cargo run --release -p tpde --example plane_records -- NEW.safetensors BASE.safetensors
//!
//! Both files need the same tensor names, dtypes and shapes (a fine-tune and its base, or two
//! checkpoints of one run).

mod measure;

use measure::{best, common_floats, open_pair, CHUNK, RUNS};
use tpde::codec::rans::{self, LaneLayout, Table};
use tpde::codec::{ChunkContext, Encoder, PositionCoder};
use tpde::DType;

/// The top plane of the XOR delta `new ^ base` rotated left by one bit (what `delta-xor`'s
/// planes hold): for bf16 and f32, the sign and exponent bits.
fn top_plane(dtype: DType, new: &[u8], base: &[u8]) -> Vec<u8> {
    let w = dtype.size() as usize;
    new.chunks_exact(w)
        .zip(base.chunks_exact(w))
        .map(|(a, b)| {
            let mut x = 0u64;
            for j in (0..w).rev() {
                x = x << 8 | u64::from(a[j] ^ b[j]);
            }
            let bits = 8 * w as u32;
            let r = (x << 1 | x >> (bits - 1)) & (u64::MAX >> (64 - bits));
            (r >> (bits - 8)) as u8
        })
        .collect()
}

#[derive(Default)]
struct Sums {
    elements: u64,
    keyframe_decode: f64,
    /// In a 1.7 file, then a 1.8 one.
    chunk_stored: [u64; 2],
    chunk_decode: [f64; 2],
    lanes_bytes: u64,
    lanes_decode: f64,
    /// Packed positions, then Golomb-Rice.
    sparse_bytes: [u64; 2],
    sparse_decode: [f64; 2],
    exceptions: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (new, base) = open_pair("plane_records")?;
    let mut sums = Sums::default();
    for (name, dtype, data, bdata) in common_floats(&new, &base) {
        let w = dtype.size() as usize;
        for (a, b) in data.chunks(CHUNK).zip(bdata.chunks(CHUNK)) {
            let n = a.len() / w;
            // The chunk as `auto` codes a delta in a 1.7 file and in a 1.8 one (sparse plane
            // records allowed), decoded whole.
            let ctx = ChunkContext { dtype, base: Some(b) };
            let mut out = vec![0u8; a.len()];
            for (k, minor) in [7, 8].into_iter().enumerate() {
                let mut stored = Vec::new();
                let (tag, params) = Encoder::Auto.encode_in(ctx, a, minor, &mut stored)?;
                tpde::codec::decode(tag, ctx, &params, &stored, &mut out)?;
                assert_eq!(out, a, "{name}: round trip");
                sums.chunk_decode[k] += best(|| tpde::codec::decode(tag, ctx, &params, &stored, &mut out).unwrap());
                sums.chunk_stored[k] += stored.len() as u64;
            }
            sums.elements += n as u64;
            // The same chunk as a keyframe, for the ratio issue 38 sets a target on.
            let key_ctx = ChunkContext::keyframe(dtype);
            let mut stored = Vec::new();
            let (tag, params) = Encoder::Auto.encode(key_ctx, a, &mut stored)?;
            sums.keyframe_decode += best(|| tpde::codec::decode(tag, key_ctx, &params, &stored, &mut out).unwrap());

            // The top plane as an order-0 lane record.
            let plane = top_plane(dtype, a, b);
            let hist = rans::histogram(&plane);
            let table = Table::from_histogram(&hist);
            let mut record = Vec::new();
            rans::encode_lanes(&table, &plane, &mut record);
            let layout = LaneLayout::read(&record, 0, n)?;
            let mut back = vec![0u8; n];
            rans::decode_lanes(&table, &record, &layout, &mut back)?;
            assert_eq!(back, plane);
            sums.lanes_decode += best(|| rans::decode_lanes(&table, &record, &layout, &mut back).unwrap());
            sums.lanes_bytes += record.len() as u64 + 2 * hist.iter().filter(|&&c| c > 0).count() as u64;

            // The same plane as a fill byte and its exceptions: their positions by a §6.5.1
            // coder (packed, which a GPU decodes block by block, or Golomb-Rice, the smallest),
            // their bytes as an order-0 lane record.
            let fill = (0..256).max_by_key(|&s| hist[s]).unwrap() as u8;
            let positions: Vec<u32> = (0..n as u32).filter(|&i| plane[i as usize] != fill).collect();
            let values: Vec<u8> = positions.iter().map(|&p| plane[p as usize]).collect();
            let vhist = rans::histogram(&values);
            let vtable = Table::from_histogram(&vhist);
            let mut vrecord = Vec::new();
            if !values.is_empty() {
                rans::encode_lanes(&vtable, &values, &mut vrecord);
            }
            let vbytes = vrecord.len() as u64 + 2 * vhist.iter().filter(|&&c| c > 0).count() as u64;
            for (k, coder) in [PositionCoder::Packed, PositionCoder::Rice].into_iter().enumerate() {
                let mut coded = Vec::new();
                coder.encode(&positions, &mut coded);
                let mut decoded = Vec::with_capacity(positions.len());
                let mut vals = vec![0u8; values.len()];
                let mut sparse_back = vec![0u8; n];
                sums.sparse_decode[k] += best(|| {
                    decoded.clear();
                    coder.decode(&coded, positions.len(), n as u64, &mut decoded).unwrap();
                    if !values.is_empty() {
                        let vl = LaneLayout::read(&vrecord, 0, values.len()).unwrap();
                        rans::decode_lanes(&vtable, &vrecord, &vl, &mut vals).unwrap();
                    }
                    sparse_back.fill(fill);
                    for (&p, &v) in decoded.iter().zip(&vals) {
                        sparse_back[p as usize] = v;
                    }
                });
                assert_eq!(sparse_back, plane);
                sums.sparse_bytes[k] += 10 + coded.len() as u64 + vbytes;
            }
            sums.exceptions += positions.len() as u64;
        }
    }
    let ms = |s: f64| s * 1e3;
    println!(
        "elements {} in dense delta chunks; top plane exceptions {:.4} of them",
        sums.elements,
        sums.exceptions as f64 / sums.elements as f64
    );
    for (k, minor) in [7, 8].into_iter().enumerate() {
        println!(
            "whole chunks as `auto` codes them in a 1.{minor} file: {} bytes stored, decoded in {:.2} ms (best of {RUNS} each, one core), {:.2} of the keyframe's {:.2} ms",
            sums.chunk_stored[k],
            ms(sums.chunk_decode[k]),
            sums.chunk_decode[k] / sums.keyframe_decode,
            ms(sums.keyframe_decode)
        );
    }
    println!(
        "top plane, order-0 lanes: {} bytes, decoded in {:.2} ms ({:.0}% of the 1.7 chunks' decode)",
        sums.lanes_bytes,
        ms(sums.lanes_decode),
        100.0 * sums.lanes_decode / sums.chunk_decode[0]
    );
    for (k, coder) in ["packed", "Golomb-Rice"].into_iter().enumerate() {
        println!(
            "top plane, fill + {coder} positions + order-0 lanes of their bytes: {} bytes ({:+.2}% of the chunks' stored), decoded in {:.2} ms",
            sums.sparse_bytes[k],
            100.0 * (sums.sparse_bytes[k] as f64 - sums.lanes_bytes as f64) / sums.chunk_stored[0] as f64,
            ms(sums.sparse_decode[k])
        );
    }
    Ok(())
}

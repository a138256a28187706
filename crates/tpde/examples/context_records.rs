//! Issue 38's question 2b, measured: could a faster context record pay? On real checkpoint pairs,
//! every chunk is coded by `auto` as in a 1.8 file, and each base-context record it holds (spec
//! §6.4.1, mode 0x04) is timed against the same plane as an order-0 lane record (mode 0x02, one
//! table). Prints their sizes and decode times on one core.
//!
//! An order-0 lane record is what any context record built on §6.2.3's lanes costs at least (one
//! table, in L1, no table index to read), so if it does not decode 1.5× faster than the
//! base-context record, no such record can, and the rule says to add none.
//!
//!     cargo run --release -p tpde --example context_records -- NEW.safetensors BASE.safetensors
//!
//! Both files need the same tensor names, dtypes and shapes.

mod measure;

use measure::{best, common_floats, end_of, open_pair, CHUNK};
use tpde::codec::planes::{self, base_contexts, PlaneRecord};
use tpde::codec::rans::{self, LaneLayout, Table};
use tpde::codec::{ChunkContext, Encoder};
use tpde::format::CodecTag;

/// Sizes in bytes and decode seconds: base-context records, then the same planes as order-0.
#[derive(Default)]
struct Sums {
    planes: u64,
    symbols: u64,
    bytes: [u64; 2],
    decode: [f64; 2],
    /// The pass over the base that gives each element its table (once per chunk).
    tables_pass: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (new, base) = open_pair("context_records")?;
    let mut sums = Sums::default();
    for (name, dtype, data, bdata) in common_floats(&new, &base) {
        let w = dtype.size() as usize;
        for (a, b) in data.chunks(CHUNK).zip(bdata.chunks(CHUNK)) {
            let n = a.len() / w;
            // The chunk as `auto` codes it in a 1.8 file; its base-context records as written.
            let ctx = ChunkContext { dtype, base: Some(b) };
            let mut stored = Vec::new();
            let (tag, _) = Encoder::Auto.encode_in(ctx, a, 8, &mut stored)?;
            if !matches!(tag, CodecTag::DeltaXorContext | CodecTag::DeltaSubContext) {
                continue;
            }
            let (records, _) = planes::parse(tag, &stored, 0, w, n)?;
            let mut contexts = Vec::new();
            let mut any = false;
            let mut start = 0;
            for record in &records {
                let begin = start;
                start = end_of(record, n);
                let PlaneRecord::BaseContexts(model, layout) = record else { continue };
                any = true;
                base_contexts(dtype, b, &mut contexts);
                let tables: Vec<u8> = contexts.iter().map(|&c| model.map()[usize::from(c)]).collect();
                let mut plane = vec![0u8; n];
                model.decode_given(&stored, layout, &tables, &mut plane)?;
                sums.decode[0] += best(|| model.decode_given(&stored, layout, &tables, &mut plane).unwrap());
                sums.bytes[0] += (start - begin) as u64;

                let hist = rans::histogram(&plane);
                let table = Table::from_histogram(&hist);
                let mut order0 = Vec::new();
                rans::encode_lanes(&table, &plane, &mut order0);
                let layout0 = LaneLayout::read(&order0, 0, n)?;
                let mut back = vec![0u8; n];
                rans::decode_lanes(&table, &order0, &layout0, &mut back)?;
                assert_eq!(back, plane, "{name}: order-0 round trip");
                sums.decode[1] += best(|| rans::decode_lanes(&table, &order0, &layout0, &mut back).unwrap());
                sums.bytes[1] += order0.len() as u64 + 2 * hist.iter().filter(|&&c| c > 0).count() as u64;
                sums.planes += 1;
                sums.symbols += n as u64;
            }
            if any {
                sums.tables_pass += best(|| base_contexts(dtype, b, &mut contexts));
            }
        }
    }
    let ms = |s: f64| s * 1e3;
    println!("{} planes coded with base contexts, {} symbols", sums.planes, sums.symbols);
    println!(
        "base-context records: {} bytes, decoded in {:.2} ms, plus {:.2} ms for the table index pass over the base",
        sums.bytes[0],
        ms(sums.decode[0]),
        ms(sums.tables_pass)
    );
    println!(
        "order-0 lane records of the same planes: {} bytes ({:+.1}%), decoded in {:.2} ms: {:.2}x faster ({:.2}x with the index pass)",
        sums.bytes[1],
        100.0 * (sums.bytes[1] as f64 / sums.bytes[0] as f64 - 1.0),
        ms(sums.decode[1]),
        sums.decode[0] / sums.decode[1],
        (sums.decode[0] + sums.tables_pass) / sums.decode[1]
    );
    Ok(())
}

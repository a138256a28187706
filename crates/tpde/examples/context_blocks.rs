//! What context records in blocks (spec 1.11: §6.2.7's mode 8, §6.4.2's mode 7) buy: on a real
//! checkpoint, every bf16 and f32 tensor's exponent plane (4 MiB chunks) as an order-0 block
//! record (§6.2.6), a neighbour-context lane record (mode 3) and a neighbour-context block record
//! (mode 8); with `--deltas`, the top plane of the XOR delta between two checkpoints as a
//! base-context lane record (mode 4) and block record (mode 7). Bytes, and decode speed on one
//! core (best of 15 runs, the record in cache) on each block loop the CPU has.
//!
//!     cargo run --release -p tpde --example context_blocks -- A.safetensors
//!     cargo run --release -p tpde --example context_blocks -- --deltas NEW.safetensors BASE.safetensors
//!
//! Each table also holds the same planes as order-0 records (modes 2 and 6): the costs of
//! `planes/cost.rs` in tpde-codec are these rows.

mod measure;

use measure::{best, CHUNK};
use tpde::codec::planes::base_contexts;
use tpde::codec::rans::{self, context, BlockLayout, BlockLoop, Contexts, LaneLayout, Table, CONTEXT_BLOCK_SYMBOLS};
use tpde::safetensors::SafetensorsFile;
use tpde::DType;

/// The top byte of each element rotated left by one bit: for bf16 and f32, the exponent.
fn exponent_plane(dtype: DType, data: &[u8]) -> Vec<u8> {
    let w = dtype.size() as usize;
    data.chunks_exact(w).map(|e| (e[w - 1] << 1) | (e[w - 2] >> 7)).collect()
}

/// Bytes and seconds of one record kind over every plane: (lanes, then each block loop).
#[derive(Default)]
struct Kind {
    bytes: u64,
    s: Vec<f64>,
}

impl Kind {
    fn add(&mut self, bytes: usize, s: &[f64]) {
        self.bytes += bytes as u64;
        self.s.resize(s.len(), 0.0);
        for (a, b) in self.s.iter_mut().zip(s) {
            *a += b;
        }
    }

    /// Adds `plane` as an order-0 lane record (mode 2) of `table`, decoded into `out`.
    fn add_lanes(&mut self, table: &Table, plane: &[u8], out: &mut [u8]) -> Result<(), String> {
        let mut rec = Vec::new();
        rans::encode_lanes(table, plane, &mut rec);
        let l = LaneLayout::read(&rec, 0, plane.len())?;
        self.add(rec.len(), &[best(|| rans::decode_lanes(table, &rec, &l, out).unwrap())]);
        assert_eq!(out, plane);
        Ok(())
    }

    fn row(&self, name: &str, symbols: u64) {
        let ns: Vec<String> = self.s.iter().map(|s| format!("{:.3}", s * 1e9 / symbols as f64)).collect();
        println!("| {name} | {} | {:.4} | {} |", self.bytes, self.bytes as f64 * 8.0 / symbols as f64, ns.join(" | "));
    }
}

/// The best time of `decode` on AVX2, then on AVX-512.
fn each_loop(mut decode: impl FnMut(BlockLoop)) -> Vec<f64> {
    [BlockLoop::Avx2, BlockLoop::Avx512].into_iter().map(|lp| best(|| decode(lp))).collect()
}

/// A context block record's map and tables, and its blocks' layout, for `n` symbols.
fn read_blocks(rec: &[u8], n: usize) -> Result<(Contexts, BlockLayout), String> {
    let (model, rest) = Contexts::read(rec)?;
    let layout = BlockLayout::read_sized(rec, rec.len() - rest.len(), n, CONTEXT_BLOCK_SYMBOLS)?;
    Ok((model, layout))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, new, base] = &args[..] {
        if flag == "--deltas" {
            return deltas(new, base);
        }
    }
    let [path] = &args[..] else { return Err("usage: context_blocks A.safetensors".into()) };
    let st = SafetensorsFile::open(path.as_ref())?;
    let (mut order0, mut lanes, mut blocks, mut symbols) = (Kind::default(), Kind::default(), Kind::default(), 0);
    let mut order0_lanes = Kind::default();
    for (_, dtype, _, data) in st.tensors() {
        if !matches!(dtype, DType::BF16 | DType::F32) || data.len() < CONTEXT_BLOCK_SYMBOLS * 4 {
            continue;
        }
        for chunk in data.chunks(CHUNK) {
            let plane = exponent_plane(dtype, chunk);
            let n = plane.len();
            symbols += n as u64;
            let mut out = vec![0u8; n];
            let table = Table::from_histogram(&rans::histogram(&plane));
            let mut rec = Vec::new();
            rans::encode_blocks(&table, &plane, &mut rec);
            let l = BlockLayout::read(&rec, 0, n)?;
            let s = each_loop(|lp| rans::decode_blocks_with(&table, &rec, &l, &mut out, lp).unwrap());
            order0.add(rec.len(), &s);
            order0_lanes.add_lanes(&table, &plane, &mut out)?;

            let pairs = context::pair_counts(&plane, rans::lane_count(n), false);
            let Some(map) = Contexts::group(&pairs) else { continue };
            let mut rec = Vec::new();
            Contexts::encode_neighbours(map, Some(&pairs), &plane, &mut rec);
            let (model, rest) = Contexts::read(&rec)?;
            let l = LaneLayout::read(&rec, rec.len() - rest.len(), n)?;
            lanes.add(rec.len(), &[best(|| model.decode_lanes(&rec, &l, &mut out).unwrap())]);

            let pairs = context::block_pair_counts(&plane, false);
            let map = Contexts::group(&pairs).expect("symbols");
            let mut rec = Vec::new();
            Contexts::encode_neighbour_blocks(map, Some(&pairs), &plane, &mut rec);
            let (model, l) = read_blocks(&rec, n)?;
            let s = each_loop(|lp| model.decode_neighbour_blocks_with(&rec, &l, &mut out, lp).unwrap());
            assert_eq!(out, plane);
            blocks.add(rec.len(), &s);
        }
    }
    println!("exponent planes of {path}: {symbols} symbols; ns a symbol on one core");
    println!("| record | bytes | bits a symbol | ns: AVX2 (lanes: best loop) | AVX-512 |\n|---|---:|---:|---:|---:|");
    order0_lanes.row("order-0 lanes (mode 2)", symbols);
    order0.row("order-0 blocks (mode 6)", symbols);
    lanes.row("context lanes (mode 3)", symbols);
    blocks.row("context blocks (mode 8)", symbols);
    Ok(())
}

/// The top plane of the XOR delta of `new` against `base`, per chunk, in base contexts.
fn deltas(new: &str, base: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (new, base) = (SafetensorsFile::open(new.as_ref())?, SafetensorsFile::open(base.as_ref())?);
    let (mut lanes, mut blocks, mut symbols) = (Kind::default(), Kind::default(), 0);
    let (mut order0_lanes, mut order0) = (Kind::default(), Kind::default());
    for (_, dtype, new, base) in measure::common_floats(&new, &base) {
        for (chunk, b) in new.chunks(CHUNK).zip(base.chunks(CHUNK)) {
            let x: Vec<u8> = chunk.iter().zip(b).map(|(a, b)| a ^ b).collect();
            let plane = exponent_plane(dtype, &x);
            let n = plane.len();
            let mut contexts = Vec::new();
            base_contexts(dtype, b, &mut contexts);
            let pairs = context::given_pair_counts(&plane, &contexts, false);
            let Some(map) = Contexts::group(&pairs) else { continue };
            symbols += n as u64;
            let model = Contexts::new(map, &pairs);
            let tables: Vec<u8> = contexts.iter().map(|&k| map[usize::from(k)]).collect();
            let mut out = vec![0u8; n];
            let mut rec = Vec::new();
            model.encode_given(&plane, &tables, &mut rec);
            let (m, rest) = Contexts::read(&rec)?;
            let l = LaneLayout::read(&rec, rec.len() - rest.len(), n)?;
            lanes.add(rec.len(), &[best(|| m.decode_given(&rec, &l, &tables, &mut out).unwrap())]);
            let mut rec = Vec::new();
            model.encode_given_blocks(&plane, &tables, &mut rec);
            let (m, l) = read_blocks(&rec, n)?;
            let s = each_loop(|lp| m.decode_given_blocks_with(&rec, &l, &tables, &mut out, lp).unwrap());
            assert_eq!(out, plane);
            blocks.add(rec.len(), &s);
            let table = Table::from_histogram(&rans::histogram(&plane));
            order0_lanes.add_lanes(&table, &plane, &mut out)?;
            let mut rec = Vec::new();
            rans::encode_blocks(&table, &plane, &mut rec);
            let l = BlockLayout::read(&rec, 0, n)?;
            order0.add(rec.len(), &each_loop(|lp| rans::decode_blocks_with(&table, &rec, &l, &mut out, lp).unwrap()));
        }
    }
    println!("top planes of the XOR deltas: {symbols} symbols; ns a symbol on one core");
    println!("| record | bytes | bits a symbol | ns: AVX2 (lanes: best loop) | AVX-512 |\n|---|---:|---:|---:|---:|");
    order0_lanes.row("order-0 lanes (mode 2)", symbols);
    order0.row("order-0 blocks (mode 6)", symbols);
    lanes.row("base-context lanes (mode 4)", symbols);
    blocks.row("base-context blocks (mode 7)", symbols);
    Ok(())
}

//! 1.10's rANS block records (spec §6.2.6, mode 0x06): valid files with whole, partial and
//! nearly empty blocks, in a keyframe and under a delta tag; and each rule broken once.

use tpde_codec::planes::PlaneRecord;
use tpde_codec::rans::{self, BlockLayout, Table};
use tpde_codec::Encoder;
use tpde_format::{surgery, CodecTag, DType, ErrorKind};

use crate::invalid::{bad, bad_delta, edit_dir};
use crate::valid::encode;
use crate::{Gen, Rng, Spec, T};

/// A keyframe whose order-0 planes are block records, as `auto` writes them in a 1.10 file.
pub const BLOCKS: &str = "valid/planes-blocks.tpde";
/// The base of [`DELTA_BLOCKS`].
const DELTA_BASE: &str = "valid/delta-blocks-base.tpde";
/// A lane-tag delta (`delta-xor-lanes`) whose planes are block records.
const DELTA_BLOCKS: &str = "valid/delta-blocks.tpde";

/// The plane records of chunk 0 of tensor `t` of `file`: the stored bytes and the records.
fn records(file: &[u8], t: usize, w: usize) -> (Vec<u8>, Vec<PlaneRecord>) {
    let dir = surgery::directory(file).expect("a valid file");
    let c = &dir.tensors[t].chunks[0];
    let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, w, c.element_count as usize).expect("valid");
    (stored, records)
}

pub fn valid(g: &mut Gen) {
    let mut rng = Rng::new(110);
    // bf16 weights of two whole blocks and one of 100 symbols (its last step has 4, states
    // 4-31 idle); f32 weights of one block and one of 5 symbols (27 states with no symbol at
    // all); f32 weights too short for a block (a lane record).
    let (a, b, c) = (2 * 16_384 + 100, 16_384 + 5, 5000);
    let normal = |n: usize, sd: f64, rng: &mut Rng| -> Vec<f64> { (0..n).map(|_| rng.normal(sd)).collect() };
    let tensors = vec![
        T::new("a.bf16", DType::BF16, &[a as u64], encode(DType::BF16, &normal(a, 0.02, &mut rng))),
        T::new("b.f32", DType::F32, &[b as u64], encode(DType::F32, &normal(b, 0.05, &mut rng))),
        T::new("c.short", DType::F32, &[c as u64], encode(DType::F32, &normal(c, 0.05, &mut rng))),
    ];
    let bytes = g.valid(
        Spec::new(
            BLOCKS,
            "§6.2.6",
            "1.10 rANS block records: the exponent planes of bf16 weights in two whole blocks and one of 100 symbols, of f32 weights in one block and one of 5 (27 states with no symbol); f32 weights too short for a block (a lane record)",
        )
        .encoder(Encoder::Auto)
        .minor(10)
        .tensors(tensors),
    );
    // The generator's promise: a block record where it says, a lane record where it says not.
    for (t, w, want) in [(0, 2, 3), (1, 4, 2), (2, 4, 1)] {
        let (_, records) = records(&bytes, t, w);
        let blocks: Vec<u32> = records
            .iter()
            .filter_map(|r| if let PlaneRecord::Blocks(_, l) = r { Some(l.blocks) } else { None })
            .collect();
        match t {
            2 => assert!(blocks.is_empty(), "tensor {t}: {records:?}"),
            _ => assert!(blocks.contains(&want), "tensor {t}: blocks {blocks:?}"),
        }
    }

    // A delta under a lane tag, every coded plane re-coded as a block record (`auto` writes
    // deltas' blocks only where no larger, which these random-walk planes are not).
    let n = 16_384 + 300;
    let base = normal(n, 0.05, &mut rng);
    let moved: Vec<f64> = base.iter().map(|&x| x + rng.normal(0.0005)).collect();
    g.valid(
        Spec::new(DELTA_BASE, "§7.3", "the keyframe of delta-blocks: 16684 f32 weights")
            .encoder(Encoder::Codec(CodecTag::PlanesLanes))
            .tensor(T::new("w", DType::F32, &[n as u64], encode(DType::F32, &base))),
    );
    let lanes = g.valid(
        Spec::new(
            "valid/delta-blocks-lanes.tpde",
            "§6.2.3",
            "the delta of delta-blocks with lane records (delta-xor-lanes)",
        )
        .encoder(Encoder::Codec(CodecTag::DeltaXorLanes))
        .minor(10)
        .tensor(T { delta: true, ..T::new("w", DType::F32, &[n as u64], encode(DType::F32, &moved)) })
        .base(DELTA_BASE),
    );
    let (stored, records) = records(&lanes, 0, 4);
    let mut recoded = Vec::new();
    let mut at = 0;
    let mut blocks = 0;
    for r in &records {
        match r {
            PlaneRecord::Lanes(table, layout) => {
                let mut plane = vec![0u8; n];
                rans::decode_lanes(table, &stored, layout, &mut plane).expect("valid");
                recoded.push(6);
                table.write(&mut recoded);
                rans::encode_blocks(table, &plane, &mut recoded);
                at = layout.bytes.end;
                blocks += 1;
            }
            PlaneRecord::Stored(s) => {
                recoded.extend_from_slice(&stored[s - 1..s + n]);
                at = s + n;
            }
            other => panic!("a lane tag's record {other:?}"),
        }
    }
    assert_eq!(at, stored.len());
    assert!(blocks >= 2, "{blocks} coded planes");
    let file = surgery::with_chunk(&lanes, 0, 0, &recoded).expect("surgery");
    g.valid_derived(
        DELTA_BLOCKS,
        "§6.2.6",
        "1.10 block records under a lane tag (delta-xor-lanes): every coded plane of the delta-blocks-lanes chunk as blocks",
        "valid/delta-blocks-lanes.tpde",
        file,
    );
}

/// The exponent plane's block record of [`BLOCKS`]'s bf16 tensor: the chunk's stored bytes,
/// and the record's layout.
fn exponent_record(file: &[u8]) -> (Vec<u8>, BlockLayout) {
    let (stored, records) = records(file, 0, 2);
    let PlaneRecord::Blocks(table, layout) = records[1].clone() else { unreachable!("the generator checked it") };
    assert_eq!(stored[layout.ends - table_len(&table) - 1], 6, "a block record");
    (stored, layout)
}

fn table_len(table: &Table) -> usize {
    let mut t = Vec::new();
    table.write(&mut t);
    t.len()
}

pub fn invalid(g: &mut Gen) {
    let file = g.get(BLOCKS).bytes.clone();
    let (stored, layout) = exponent_record(&file);
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = stored.clone();
        f(&mut s);
        surgery::with_chunk(&file, 0, 0, &s).expect("surgery")
    };
    let put = |s: &mut Vec<u8>, at: usize, v: u32| s[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let get = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    let (ends, states, words) = (layout.ends, layout.states, layout.words.clone());
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "r25-blocks-state-below",
            "a block record whose block 1 state 7 starts at 0xFFFF, below 2^16",
            edit(&|s| put(s, states + 4 * (32 + 7), 0xFFFF)),
        ),
        (
            "r25-blocks-end-decreasing",
            "a block record whose end[1] is below end[0]",
            edit(&|s| {
                let e0 = get(s, ends);
                put(s, ends + 4, e0 - 1)
            }),
        ),
        (
            "r25-blocks-words-past-chunk",
            "a block record whose last end counts one word more than the chunk holds",
            edit(&|s| {
                let last = ends + 4 * 2;
                let e = get(s, last);
                put(s, last, e + (s.len() - words.end) as u32 / 2 + 1)
            }),
        ),
        (
            "r25-blocks-out-of-words",
            "a block record whose block 0 ends one word early (its last word counted in block 1's)",
            edit(&|s| {
                let e0 = get(s, ends);
                put(s, ends, e0 - 1)
            }),
        ),
        (
            "r25-blocks-words-left-over",
            "a block record whose last block has one word more than it reads",
            edit(&|s| {
                s.splice(words.end..words.end, [0x34, 0x12]);
                let last = ends + 4 * 2;
                let e = get(s, last);
                put(s, last, e + 1)
            }),
        ),
        (
            "r25-blocks-final-state",
            "a block record whose block 0 state 0 starts one higher (at least 2^16, but its decode does not end at 2^16)",
            edit(&|s| {
                let x = get(s, states);
                put(s, states, x + 1)
            }),
        ),
        ("r25-blocks-cut", "a chunk cut inside its block record's index", edit(&|s| s.truncate(states + 10))),
        (
            "r25-blocks-serial-tag",
            "a chunk with block records relabelled planes (0x0002, serial), which allows modes 0 and 1 only",
            edit_dir(&file, |d| d.tensors[0].chunks[0].codec = CodecTag::Planes),
        ),
    ];
    for (path, description, bytes) in cases {
        bad(g, path, "R25", description, bytes, ErrorKind::Malformed);
    }
    // Under a delta tag: a word changed in the last coded plane.
    let delta = g.get(DELTA_BLOCKS).bytes.clone();
    let (mut s, records) = records(&delta, 0, 4);
    let Some(PlaneRecord::Blocks(_, l)) = records.iter().rev().find(|r| matches!(r, PlaneRecord::Blocks(..))).cloned()
    else {
        unreachable!("the generator checked it")
    };
    s[l.words.start + 7] ^= 0x40;
    let bytes = surgery::with_chunk(&delta, 0, 0, &s).expect("surgery");
    bad_delta(
        g,
        "r25-blocks-delta-word",
        "R25",
        "a delta-xor-lanes chunk whose last block record has one word changed",
        bytes,
        DELTA_BASE,
        ErrorKind::Malformed,
    );
}

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
/// A `sparse-packed-lanes` delta against [`DELTA_BASE`], one element in 7 changed.
const SPARSE_LANES: &str = "valid/delta-sparse-lanes-of-blocks-base.tpde";
/// [`DELTA_BASE`] as a `sparse-packed-lanes` delta of itself: m = 0.
const SPARSE_EMPTY: &str = "valid/delta-sparse-empty.tpde";

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
    // The same file declaring 1.9, below the 1.10 that defines mode 0x06: a reader judges each
    // record by itself, never by the declared version (§11).
    g.valid_derived(
        "valid/planes-blocks-declared-1-9.tpde",
        "§11",
        "planes-blocks declaring version 1.9: block records (1.10) and a lower declared version, which a reader must not reject",
        BLOCKS,
        surgery::with_header(&bytes, |h| h.minor_version = 9).expect("surgery"),
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
    let (file, recoded) = lanes_as_blocks(&lanes);
    assert!(recoded.len() >= 2, "{} coded planes", recoded.len());
    g.valid_derived(
        DELTA_BLOCKS,
        "§6.2.6",
        "1.10 block records under a lane tag (delta-xor-lanes): every coded plane of the delta-blocks-lanes chunk as blocks",
        "valid/delta-blocks-lanes.tpde",
        file,
    );
}

/// `file` with every order-0 lane record of every chunk re-coded as a block record, the other
/// records as they are (§6.2.6 allows blocks wherever a tag allows lanes, whatever n): the
/// file and the tag of each record re-coded.
fn lanes_as_blocks(file: &[u8]) -> (Vec<u8>, Vec<CodecTag>) {
    let dir = surgery::directory(file).expect("a valid file");
    let (mut out, mut recoded) = (file.to_vec(), Vec::new());
    for (t, tensor) in dir.tensors.iter().enumerate() {
        for (ci, c) in tensor.chunks.iter().enumerate() {
            let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
            let w = tensor.dtype.size() as usize;
            let Some((start, n)) = planes_of(c.codec, stored, c.element_count as usize) else { continue };
            let mut chunk = stored[..start].to_vec();
            let mut at = start;
            for _ in 0..w {
                let Ok((records, next)) = tpde_codec::planes::parse(c.codec, stored, at, 1, n) else {
                    break; // not a plane tag: left as it is
                };
                match &records[0] {
                    PlaneRecord::Lanes(table, layout) => {
                        let mut plane = vec![0u8; n];
                        rans::decode_lanes(table, stored, layout, &mut plane).expect("valid");
                        chunk.push(6);
                        table.write(&mut chunk);
                        rans::encode_blocks(table, &plane, &mut chunk);
                        recoded.push(c.codec);
                    }
                    // A plane of no symbols (m = 0): one block, no word, 32 states at 2^16,
                    // under any table.
                    PlaneRecord::Stored(_) if n == 0 => {
                        chunk.push(6);
                        let table = Table::from_histogram(&std::array::from_fn(|s| u64::from(s < 2)));
                        table.write(&mut chunk);
                        rans::encode_blocks(&table, &[], &mut chunk);
                        recoded.push(c.codec);
                    }
                    _ => chunk.extend_from_slice(&stored[at..next]),
                }
                at = next;
            }
            if at > start && chunk != stored[..at] {
                chunk.extend_from_slice(&stored[at..]);
                out = surgery::with_chunk(&out, t, ci, &chunk).expect("surgery");
            }
        }
    }
    (out, recoded)
}

/// Where a chunk's plane records start and how many symbols each codes: §6.2's plane tags at
/// 0 with n; §6.5's sparse lane tag after its positions, with m; None for a tag with no
/// plane records in lane form.
fn planes_of(codec: CodecTag, stored: &[u8], n: usize) -> Option<(usize, usize)> {
    let u32_at = |i: usize| u32::from_le_bytes(stored[i..i + 4].try_into().expect("a valid chunk")) as usize;
    match codec {
        CodecTag::SparsePackedLanes => Some((8 + u32_at(4), u32_at(0))),
        CodecTag::PlanesLanes
        | CodecTag::PlanesContext
        | CodecTag::DeltaXorLanes
        | CodecTag::DeltaSubLanes
        | CodecTag::DeltaXorContext
        | CodecTag::DeltaSubContext
        | CodecTag::DeltaPredicted => Some((0, n)),
        _ => None,
    }
}

/// Block records where no other valid file has them: under the base-context tags, in
/// predicted chunks' residuals, in sparse chunks' value planes (m = 0 included).
pub fn elsewhere(g: &mut Gen) {
    // A sparse chunk's value planes as blocks (m symbols each); and a chunk that lists no
    // element (m = 0), whose empty planes become blocks of no word.
    let (base, moved) = {
        let b = g.get(DELTA_BASE).tensors[0].clone();
        let mut moved = b.data.clone();
        for i in (0..moved.len()).step_by(4 * 7) {
            moved[i] ^= 0x10;
        }
        (b, moved)
    };
    g.valid(
        Spec::new(
            SPARSE_LANES,
            "§6.5",
            "the keyframe of delta-blocks with one element in 7 changed in its lowest byte, sparse-packed-lanes",
        )
        .encoder(Encoder::Codec(CodecTag::SparsePackedLanes))
        .minor(10)
        .tensor(T { delta: true, ..T::new("w", DType::F32, &base.shape, moved) })
        .base(DELTA_BASE),
    );
    g.valid(
        Spec::new(
            SPARSE_EMPTY,
            "§6.5",
            "the keyframe of delta-blocks as a delta of itself, sparse-packed-lanes: m = 0 in every chunk",
        )
        .encoder(Encoder::Codec(CodecTag::SparsePackedLanes))
        .minor(10)
        .tensor(T { delta: true, ..base.clone() })
        .base(DELTA_BASE),
    );
    let cases = [
        (
            CodecTag::DeltaXorContext,
            "valid/delta-xor-context.tpde",
            "valid/delta-xor-context-blocks.tpde",
            "delta-xor-context with its order-0 lane records re-coded as block records (1.10), beside its base-context records",
        ),
        (
            CodecTag::DeltaSubContext,
            crate::valid::DELTA_SUB_CONTEXT,
            "valid/delta-sub-context-blocks.tpde",
            "delta-sub-context with its order-0 lane records re-coded as block records (1.10), beside its base-context records",
        ),
        (
            CodecTag::DeltaPredicted,
            crate::reverse::REVERSE,
            "valid/delta-predicted-reverse-blocks.tpde",
            "delta-predicted-reverse with its residuals' order-0 lane records re-coded as block records (1.10), under delta-predicted and the plain deltas' tags",
        ),
        (
            CodecTag::SparsePackedLanes,
            SPARSE_LANES,
            "valid/delta-sparse-packed-lanes-blocks.tpde",
            "delta-sparse-lanes-of-blocks-base with the value planes' lane records re-coded as block records (1.10) of m symbols",
        ),
        (
            CodecTag::SparsePackedLanes,
            SPARSE_EMPTY,
            "valid/delta-sparse-empty-blocks.tpde",
            "delta-sparse-empty with each value plane of m = 0 symbols a block record: one block, no word, 32 states at 2^16",
        ),
    ];
    for (tag, from, path, description) in cases {
        let (file, recoded) = lanes_as_blocks(&g.get(from).bytes.clone());
        assert!(recoded.iter().filter(|&&t| t == tag).count() >= 2, "{path}: re-coded {recoded:?}");
        let file = surgery::with_header(&file, |h| h.minor_version = h.minor_version.max(10)).expect("surgery");
        g.valid_derived(path, "§6.2.6", description, from, file);
    }
}

/// The exponent plane's block record of [`BLOCKS`]'s bf16 tensor: the chunk's stored bytes,
/// and the record's layout.
fn exponent_record(file: &[u8]) -> (Vec<u8>, Table, BlockLayout) {
    let (stored, records) = records(file, 0, 2);
    let PlaneRecord::Blocks(table, layout) = records[1].clone() else { unreachable!("the generator checked it") };
    assert_eq!(stored[layout.ends - table_len(&table) - 1], 6, "a block record");
    (stored, table, layout)
}

fn table_len(table: &Table) -> usize {
    let mut t = Vec::new();
    table.write(&mut t);
    t.len()
}

/// How [`encode_by_hand`] departs from §6.2.6's encoder, in one state of one block.
#[derive(Clone, Copy)]
enum Departure {
    /// None: the bytes `rans::encode_blocks` writes.
    None,
    /// State `j` of block `b` ends at 2^16 + 1: every word is read and every symbol decodes, but
    /// that final state is not 2^16.
    FinalState { b: usize, j: usize },
    /// State `j` of block `b` gives out one more word at its first symbol, so that its initial
    /// state is below 2^16: a decoder that starts from it anyway decodes every symbol, reads
    /// every word and ends at 2^16 (the state must take no word at that symbol already).
    StateBelow { b: usize, j: usize },
}

/// The index and words of a block record of `symbols` (spec §6.2.6: end[], state[], word[]),
/// encoded here from the text, apart from the reference's encoder, with one `departure`.
fn encode_by_hand(table: &Table, symbols: &[u8], departure: Departure, out: &mut Vec<u8>) {
    let (freq, start) = (table.freqs(), table.starts());
    let (mut ends, mut states, mut words) = (Vec::new(), Vec::new(), Vec::new());
    for (b, block) in symbols.chunks(16_384).enumerate() {
        let mut x = [1u32 << 16; 32];
        if let Departure::FinalState { b: fb, j } = departure {
            if fb == b {
                x[j] += 1;
            }
        }
        // Backwards through the decoder's order, so that each state's word is given out where
        // the decoder reads it; the block's words are reversed at the end.
        let mut reversed = Vec::new();
        for i in (0..block.len()).rev() {
            let (j, s) = (i % 32, usize::from(block[i]));
            let f = u32::from(freq[s]);
            if u64::from(x[j]) >= u64::from(f) << 20 {
                reversed.push(x[j] as u16);
                x[j] >>= 16;
            } else if matches!(departure, Departure::StateBelow { b: db, j: dj } if db == b && dj == j && i == j) {
                reversed.push(x[j] as u16);
                x[j] >>= 16;
                assert!(x[j] >= 1, "a state of at least 2^16 before its first symbol");
            }
            x[j] = (x[j] / f) * 4096 + x[j] % f + start[s];
        }
        states.extend(x);
        words.extend(reversed.into_iter().rev());
        ends.push(words.len() as u32);
    }
    if symbols.is_empty() {
        ends.push(0);
        states.extend([1u32 << 16; 32]);
    }
    out.extend(ends.iter().flat_map(|e| e.to_le_bytes()));
    out.extend(states.iter().flat_map(|s| s.to_le_bytes()));
    out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
}

/// Panics unless the invalid file `name`, made from [`BLOCKS`] (`valid`), breaks exactly one
/// condition of §6.2.6 in the block record it changed, or none where it breaks another rule.
fn block_isolated(name: &str, bytes: &[u8], valid: &[u8]) {
    let (t, w, want): (usize, usize, &[&str]) = match name {
        "r25-blocks-state-below" => (0, 2, &["an initial state below 2^16"]),
        // end[b] is where block b's words stop and block b + 1's start: one below end[b − 1]
        // leaves block b no words and starts block b + 1 inside block b − 1's, so a decreasing
        // end cannot be broken alone (the manifest's description says so).
        "r25-blocks-end-decreasing" => (0, 2, &["an end that decreases", "a block out of words", "words left over"]),
        "r25-blocks-words-past-chunk" => (0, 2, &["words past the chunk"]),
        "r25-blocks-out-of-words" => (0, 2, &["a block out of words"]),
        "r25-blocks-words-left-over" => (0, 2, &["words left over"]),
        "r25-blocks-final-state" => (0, 2, &["a final state other than 2^16"]),
        "r25-blocks-idle-state" => (1, 4, &["a final state other than 2^16"]),
        // A cut index and a tag that allows no blocks break other conditions than the decode's.
        _ => return,
    };
    let (_, records) = records(valid, t, w);
    let Some(PlaneRecord::Blocks(table, layout)) =
        records.iter().rev().find(|r| matches!(r, PlaneRecord::Blocks(..))).cloned()
    else {
        unreachable!("the generator checked it")
    };
    let c = surgery::directory(bytes).expect("a directory").tensors[t].chunks[0].clone();
    let from = c.offset as usize + layout.ends;
    let n = c.element_count as usize;
    let broken = crate::isolation::broken_block_conditions(
        table.freqs(),
        &bytes[from..],
        c.stored_length as usize - layout.ends,
        n,
    );
    assert_eq!(broken, want, "{name}: its block record breaks {broken:?} (§6.2.6)");
}

pub fn invalid(g: &mut Gen) {
    let file = g.get(BLOCKS).bytes.clone();
    let (stored, table, layout) = exponent_record(&file);
    // The exponent record encoded by hand with a departure: the chunk's stored bytes (the
    // record ends the chunk). Without one, the encoder written from the text gives the
    // reference's bytes.
    let mut plane = vec![0u8; 2 * 16_384 + 100];
    rans::decode_blocks(&table, &stored, &layout, &mut plane).expect("valid");
    assert_eq!(layout.words.end, stored.len(), "the exponent record ends the chunk");
    let by_hand = |departure| {
        let mut s = stored[..layout.ends].to_vec();
        encode_by_hand(&table, &plane, departure, &mut s);
        s
    };
    assert_eq!(by_hand(Departure::None), stored, "the hand encoder");
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = stored.clone();
        f(&mut s);
        surgery::with_chunk(&file, 0, 0, &s).expect("surgery")
    };
    let put = |s: &mut Vec<u8>, at: usize, v: u32| s[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let get = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    let (ends, states, words) = (layout.ends, layout.states, layout.words.clone());
    // A state that takes no word at its first symbol, for the state-below file.
    let state_below = (0..32)
        .map(|j| Departure::StateBelow { b: 1, j })
        .find(|&d| by_hand(d).len() == stored.len() + 2)
        .expect("a state of block 1 that takes no word at step 0");
    assert!(matches!(state_below, Departure::StateBelow { j: 1, .. }), "the description names state 1");
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "r25-blocks-state-below",
            "a block record whose block 1 state 1 starts below 2^16, one more word given out at its first symbol: without the bound, every symbol decodes, every word is read and every state ends at 2^16",
            surgery::with_chunk(&file, 0, 0, &by_hand(state_below)).expect("surgery"),
        ),
        (
            "r25-blocks-end-decreasing",
            "a block record whose end[1] is below end[0] (which cannot break one condition alone: block 1 has no words to read, block 2 starts inside block 0's and reads one word too many)",
            edit(&|s| {
                let e0 = get(s, ends);
                put(s, ends + 4, e0 - 1)
            }),
        ),
        (
            "r25-blocks-words-past-chunk",
            "a chunk whose stored_length stops one word short of its block record's last word (that word still in the file right after it, the chunk's CRC over the shorter bytes): a reader that reads past the chunk decodes it",
            edit_dir(&file, |d| {
                let c = &mut d.tensors[0].chunks[0];
                c.stored_length -= 2;
                c.crc32 = crc32fast::hash(&stored[..stored.len() - 2]);
            }),
        ),
        (
            "r25-blocks-out-of-words",
            "a block record whose last block with words owns one word less (its end, the ends after it and the chunk's stored_length one word lower; the word it reads last still in the file right after the chunk, the CRC over the shorter bytes)",
            {
                // The block that reads the last word (block 2 may read none) and those after
                // it own one word less.
                let mut s = stored.clone();
                let end = |s: &[u8], b: usize| if b == 0 { 0 } else { get(s, ends + 4 * (b - 1)) };
                let reader = (0..3).rev().find(|&b| end(&s, b + 1) > end(&s, b)).expect("a block with words");
                for b in reader..3 {
                    let e = get(&s, ends + 4 * b);
                    put(&mut s, ends + 4 * b, e - 1);
                }
                edit_dir(&surgery::with_chunk(&file, 0, 0, &s).expect("surgery"), |d| {
                    let c = &mut d.tensors[0].chunks[0];
                    c.stored_length -= 2;
                    c.crc32 = crc32fast::hash(&s[..s.len() - 2]);
                })
            },
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
            "a block record whose block 0 state 0 ends at 2^16 + 1 (encoded from there): every symbol decodes and every word is read",
            surgery::with_chunk(&file, 0, 0, &by_hand(Departure::FinalState { b: 0, j: 0 })).expect("surgery"),
        ),
        (
            "r25-blocks-idle-state",
            "tensor b.f32's block record whose block 1 (5 symbols) has state 9, which takes no symbol, starting at 2^16 + 1: it ends there",
            {
                let (mut s, records) = records(&file, 1, 4);
                let Some(PlaneRecord::Blocks(_, l)) = records.iter().find(|r| matches!(r, PlaneRecord::Blocks(_, l) if l.blocks == 2))
                else {
                    unreachable!("the generator checked it")
                };
                put(&mut s, l.states + 4 * (32 + 9), (1 << 16) + 1);
                surgery::with_chunk(&file, 1, 0, &s).expect("surgery")
            },
        ),
        ("r25-blocks-cut", "a chunk cut inside its block record's index", edit(&|s| s.truncate(states + 10))),
        (
            "r25-blocks-serial-tag",
            "a chunk with block records relabelled planes (0x0002, serial), which allows modes 0 and 1 only",
            edit_dir(&file, |d| d.tensors[0].chunks[0].codec = CodecTag::Planes),
        ),
    ];
    for (path, description, bytes) in cases {
        block_isolated(path, &bytes, &file);
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

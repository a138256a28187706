//! 1.11's context block records: base contexts (spec §6.4.2, mode 0x07), valid under both dense
//! delta tags and `delta-predicted`, and neighbour contexts (§6.2.7, mode 0x08) in a keyframe,
//! with whole and partial blocks of 65536 symbols; and each rule the modes add broken once
//! (their maps, their words, the tags that allow them).

use tpde_codec::planes::PlaneRecord;
use tpde_codec::rans::{self, Contexts, Table};
use tpde_codec::Encoder;
use tpde_format::{surgery, CodecTag, DType, ErrorKind, Prediction};

use crate::invalid::{bad, bad_delta};
use crate::valid::{encode, prediction_of, weights_and_steps};
use crate::{Gen, Rng, Spec, T};

/// The keyframe the base-context block deltas decode against.
pub(crate) const BASE: &str = "valid/context-blocks-base.tpde";
/// `delta-xor-context` whose float planes are mode-7 records.
const XOR: &str = "valid/delta-xor-context-blocks-1-11.tpde";
/// The base of [`PREDICTED`]: weights and the Adam moments predictor 4 reads.
const PREDICTED_BASE: &str = "valid/delta-predicted-context-blocks-base.tpde";
/// `delta-predicted` whose residual's planes are mode-7 records.
const PREDICTED: &str = "valid/delta-predicted-context-blocks.tpde";

/// A `planes-context` keyframe whose exponent plane is a mode-8 record.
const KEYFRAME: &str = "valid/planes-context-blocks.tpde";

/// The mode-7 and mode-8 records of every chunk 0 of `file`: (tensor, stored bytes, record).
pub(crate) fn context_blocks(file: &[u8]) -> Vec<(usize, Vec<u8>, PlaneRecord)> {
    let dir = surgery::directory(file).expect("a valid file");
    let mut found = Vec::new();
    for (t, tensor) in dir.tensors.iter().enumerate() {
        let c = &tensor.chunks[0];
        let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
        let w = tensor.dtype.size() as usize;
        let Ok((records, _)) = tpde_codec::planes::parse(c.codec, &stored, 0, w, c.element_count as usize) else {
            continue;
        };
        let blocks = |r: &PlaneRecord| matches!(r, PlaneRecord::BaseContextBlocks(..) | PlaneRecord::ContextBlocks(..));
        for r in records.into_iter().filter(blocks) {
            found.push((t, stored.clone(), r));
        }
    }
    found
}

pub fn valid(g: &mut Gen) {
    // bf16 weights of two whole blocks and one of 4464 symbols, f32 of one whole and one of
    // 1 symbol: each moved by a small step in value, so its step in bits follows its exponent.
    let mut rng = Rng::new(111);
    let (mut base, mut moved) = (Vec::new(), Vec::new());
    for (name, dtype, n) in [("w.bf16", DType::BF16, 2 * 65_536 + 4464), ("w.f32", DType::F32, 65_537)] {
        let (b, m) = weights_and_steps(dtype, n, &mut rng);
        base.push(T::new(name, dtype, &[n as u64], b));
        moved.push(T { delta: true, ..T::new(name, dtype, &[n as u64], m) });
    }
    g.valid(
        Spec::new(
            BASE,
            "§6.4.2",
            "the keyframe the 1.11 base-context block deltas decode against: bf16 and f32 weights over ten binades",
        )
        .encoder(Encoder::Codec(CodecTag::PlanesLanes))
        .chunk_bytes(1 << 20)
        .tensors(base),
    );
    for (lanes, path, tag) in [
        ("valid/delta-xor-context-lanes-of-blocks-base.tpde", XOR, CodecTag::DeltaXorContext),
        (
            "valid/delta-sub-context-lanes-of-blocks-base.tpde",
            "valid/delta-sub-context-blocks-1-11.tpde",
            CodecTag::DeltaSubContext,
        ),
    ] {
        let file = g.valid(
            Spec::new(lanes, "§6.4.1", &format!("{tag} of every weight of context-blocks-base moved by a small step in value: base-context lane records (mode 4), as 1.4 wrote them"))
                .encoder(Encoder::Codec(tag))
                .chunk_bytes(1 << 20)
                .tensors(moved.clone())
                .base(BASE),
        );
        let file = as_context_blocks(g, &file);
        let file = surgery::with_header(&file, |h| h.minor_version = 11).expect("surgery");
        let blocks: Vec<u32> = context_blocks(&file)
            .into_iter()
            .map(|(_, _, r)| match r {
                PlaneRecord::BaseContextBlocks(_, l) | PlaneRecord::ContextBlocks(_, l) => l.blocks,
                _ => unreachable!(),
            })
            .collect();
        assert!(blocks.contains(&3) && blocks.contains(&2), "{path}: mode-7 records of {blocks:?} blocks");
        let description = format!(
            "{lanes} with its base-context lane records re-coded as base-context block records (mode 7, 1.11), same map and tables: whole blocks of 65536 symbols and a partial one (bf16: 3 blocks, the last of 4464 symbols; f32: 2, the last of 1)"
        );
        g.valid_derived(path, "§6.4.2", &description, lanes, file);
    }
    let file = g.get(XOR).bytes.clone();
    let declared = surgery::with_header(&file, |h| h.minor_version = 10).expect("surgery");
    g.valid_derived(
        "valid/delta-context-blocks-declared-1-10.tpde",
        "§11",
        "delta-xor-context-blocks-1-11 declaring 1.10: a reader judges a plane record's mode by itself, never by the minor version",
        XOR,
        declared,
    );
    predicted(g);
    keyframe(g);
}

/// A keyframe of rows that each share a scale: its exponent plane takes neighbour contexts,
/// in blocks (mode 8) in a 1.11 file.
fn keyframe(g: &mut Gen) {
    let mut rng = Rng::new(113);
    let n = 2 * 65_536 + 3001;
    // Rows of 256 whose scale is 2^-(row mod 17), each element within a factor of 4 of it.
    let values: Vec<f64> = (0..n).map(|i| (-(((i / 256) % 17) as f64)).exp2() * (1.0 + 3.0 * rng.unit())).collect();
    let file = g.valid(
        Spec::new(
            KEYFRAME,
            "§6.2.7",
            "a planes-context keyframe in a 1.11 file of f32 rows that each share a scale: the exponent plane is a neighbour-context block record (mode 8) of 3 blocks, the last of 3001 symbols",
        )
        .encoder(Encoder::Auto)
        .minor(11)
        .tensor(T::new("rows", DType::F32, &[n as u64], encode(DType::F32, &values))),
    );
    let found: Vec<u32> = context_blocks(&file)
        .into_iter()
        .map(|(_, _, r)| match r {
            PlaneRecord::ContextBlocks(_, l) => l.blocks,
            other => unreachable!("{other:?}"),
        })
        .collect();
    assert_eq!(found, [3], "{KEYFRAME}");
    let declared = surgery::with_header(&file, |h| h.minor_version = 10).expect("surgery");
    g.valid_derived(
        "valid/planes-context-blocks-declared-1-10.tpde",
        "§11",
        "planes-context-blocks declaring 1.10: a reader judges a plane record's mode by itself",
        KEYFRAME,
        declared,
    );
}

/// A reverse parameter step (predictor 4, which reads the base's moments) whose weights miss
/// their prediction by a few units in the last place, more for smaller weights: the residual's
/// planes are mode-7 records, their contexts the prediction's exponents (§6.8).
fn predicted(g: &mut Gen) {
    let mut rng = Rng::new(112);
    let n = 65_536 + 900;
    let (w, _) = weights_and_steps(DType::F32, n, &mut rng);
    let m: Vec<f64> = (0..n).map(|_| rng.normal(1e-3)).collect();
    let v: Vec<f64> = (0..n).map(|_| rng.normal(1e-3).powi(2) + 1e-9).collect();
    let (m, v) = (encode(DType::F32, &m), encode(DType::F32, &v));
    g.valid(
        Spec::new(
            PREDICTED_BASE,
            "§6.4.2",
            "the base of delta-predicted-context-blocks: f32 weights over ten binades and Adam moments c0, sv",
        )
        .encoder(Encoder::Codec(CodecTag::PlanesLanes))
        .tensors(vec![
            T::new("w", DType::F32, &[n as u64], w.clone()),
            T::new("c0", DType::F32, &[n as u64], m.clone()),
            T::new("sv", DType::F32, &[n as u64], v.clone()),
        ]),
    );
    let p = Prediction::AdamParameterReverse {
        decay: 0.99999,
        bias2_sqrt: 0.05,
        eps: 1e-8,
        neg_step: -1e-3,
        exp_avg: "c0".into(),
        exp_avg_sq: "sv".into(),
    };
    let mut data = prediction_of(&p, &w, &m, &v);
    for (i, e) in data.chunks_exact_mut(4).enumerate() {
        let x = u32::from_le_bytes(e.try_into().expect("4 bytes"));
        // Under 1, 8, 64 or 512 units in the last place by the exponent's last two bits, from a
        // fixed sequence: how far a weight misses depends on its exponent.
        let exponent = (x >> 23) & 0xFF;
        let units = ((i as u32).wrapping_mul(2_654_435_761) >> 12) % (1 << (3 * (exponent % 4)));
        e.copy_from_slice(&(x ^ units).to_le_bytes());
    }
    let file = g.valid(
        Spec::new(
            PREDICTED,
            "§6.4.2",
            "delta-predicted (predictor 4) in a 1.11 file, each weight a few units in the last place from its prediction: the residual's planes are base-context block records whose contexts are the prediction's exponents",
        )
        .encoder(Encoder::Auto)
        .minor(11)
        .tensors(vec![T { delta: true, predict: Some(p), ..T::new("w", DType::F32, &[n as u64], data) }])
        .base(PREDICTED_BASE),
    );
    let d = surgery::directory(&file).expect("a valid file");
    assert_eq!(d.tensors[0].chunks[0].codec, CodecTag::DeltaPredicted, "{PREDICTED}");
    assert!(!context_blocks(&file).is_empty(), "{PREDICTED}: a mode-7 record");
}

/// Each rule mode 7 adds, broken once in the first mode-7 record of [`XOR`] (its tensor's only
/// chunk): the map's entries, its blocks' words, and the tags that allow the mode.
pub fn invalid(g: &mut Gen) {
    let file = g.get(XOR).bytes.clone();
    let (t, stored, record) = context_blocks(&file).into_iter().next().expect("a mode-7 record");
    let PlaneRecord::BaseContextBlocks(model, layout) = record else { unreachable!() };
    let map = layout.ends - model.tables().iter().map(table_len).sum::<usize>() - 256;
    assert_eq!(stored[map - 1], 7, "a mode-7 record");
    let get = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    let put = |s: &mut Vec<u8>, at: usize, v: u32| s[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = stored.clone();
        f(&mut s);
        surgery::with_chunk(&file, t, 0, &s).expect("surgery")
    };
    let last_end = layout.ends + 4 * (layout.blocks as usize - 1);
    let contexts = base_contexts_of(g, &file, t);
    let unused = (0..256).find(|&k| !contexts.contains(&(k as u8))).expect("a context no element has");
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "r25-context-blocks-map-entry-16",
            "a base-context block record whose map sends a context no base element has to table 16, past the 16 allowed (the tables that follow as they were)",
            edit(&|s| s[map + unused] = 16),
        ),
        (
            "r25-context-blocks-words-left-over",
            "a base-context block record whose last block has one word more than it reads",
            edit(&|s| {
                s.splice(layout.words.end..layout.words.end, [0x34, 0x12]);
                let e = get(s, last_end);
                put(s, last_end, e + 1)
            }),
        ),
    ];
    for (path, description, bytes) in cases {
        bad_delta(g, path, "R25", description, bytes, BASE, ErrorKind::Malformed);
    }
    // Mode 8's map, for a symbol the plane never holds (so no symbol decodes differently).
    bad(
        g,
        "r25-context-blocks-neighbour-map-entry-16",
        "R25",
        "a neighbour-context block record (mode 8) whose map sends a symbol the plane never holds to table 16, past the 16 allowed",
        with_neighbour_map_entry(g, 16),
        ErrorKind::Malformed,
    );
    // Mode 8 where a tag does not allow it: the first mode-7 plane of the delta re-coded as a
    // mode-8 record of one table, whose symbols decode exactly.
    let tables: Vec<u8> = contexts.iter().map(|&k| model.map()[usize::from(k)]).collect();
    let mut plane = vec![0u8; tables.len()];
    model.decode_given_blocks(&stored, &layout, &tables, &mut plane).expect("valid");
    let mut s = stored[..map - 1].to_vec();
    s.push(8);
    Contexts::encode_neighbour_blocks([0; 256], Some(&pairs_of(&plane)), &plane, &mut s);
    s.extend_from_slice(&stored[layout.words.end..]);
    bad_delta(
        g,
        "r25-context-blocks-delta-tag",
        "R25",
        "a delta-xor-context chunk whose first base-context block record is re-coded as a neighbour-context block record (mode 8, one table): the tag allows modes 0, 2, 4, 5, 6 and 7",
        surgery::with_chunk(&file, t, 0, &s).expect("surgery"),
        BASE,
        ErrorKind::Malformed,
    );
    // Mode 7 where a tag does not allow it: the exponent plane of a planes-context keyframe
    // re-coded as a mode-7 record of one table (every context mapped to it).
    let key = g.get(crate::blocks::BLOCKS).bytes.clone();
    let dir = surgery::directory(&key).expect("a valid file");
    let c = &dir.tensors[0].chunks[0];
    let stored = key[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    let n = c.element_count as usize;
    let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, 2, n).expect("valid");
    let PlaneRecord::Blocks(table, l) = &records[1] else { unreachable!("the generator checked it") };
    let mut plane = vec![0u8; n];
    rans::decode_blocks(table, &stored, l, &mut plane).expect("valid");
    let start = l.ends - table_len(table) - 1;
    let mut s = stored[..start].to_vec();
    s.push(7);
    let one = Contexts::new([0; 256], &pairs_of(&plane));
    one.encode_given_blocks(&plane, &vec![0; n], &mut s);
    let bytes = surgery::with_chunk(&key, 0, 0, &s).expect("surgery");
    bad(
        g,
        "r25-context-blocks-keyframe-tag",
        "R25",
        &format!("a {} keyframe chunk whose exponent plane is a mode-7 record (one table, every context mapped to it): the tag allows modes 0, 2, 3 and 6", c.codec),
        bytes,
        ErrorKind::Malformed,
    );
}

/// [`KEYFRAME`] with the map entry of its mode-8 record for a symbol the plane never holds set
/// to `entry`: no symbol decodes differently.
pub(crate) fn with_neighbour_map_entry(g: &Gen, entry: u8) -> Vec<u8> {
    let key = g.get(KEYFRAME).bytes.clone();
    let (t, stored, record) = context_blocks(&key).into_iter().next().expect("a mode-8 record");
    let PlaneRecord::ContextBlocks(model, layout) = record else { unreachable!() };
    let map = layout.ends - model.tables().iter().map(table_len).sum::<usize>() - 256;
    assert_eq!(stored[map - 1], 8, "a mode-8 record");
    let n = surgery::directory(&key).expect("a valid file").tensors[t].chunks[0].element_count as usize;
    let mut plane = vec![0u8; n];
    model.decode_neighbour_blocks_with(&stored, &layout, &mut plane, rans::BlockLoop::Scalar).expect("valid");
    let absent = (1..256).find(|&a| !plane.contains(&(a as u8))).expect("a symbol the plane never holds");
    let mut s = stored;
    s[map + absent] = entry;
    surgery::with_chunk(&key, t, 0, &s).expect("surgery")
}

/// `file` (a delta against [`BASE`]) with every base-context lane record (mode 4) re-coded as
/// a base-context block record (mode 7) of the same map and tables.
fn as_context_blocks(g: &Gen, file: &[u8]) -> Vec<u8> {
    let dir = surgery::directory(file).expect("a valid file");
    let mut out = file.to_vec();
    for (t, tensor) in dir.tensors.iter().enumerate() {
        let c = &tensor.chunks[0];
        assert_eq!(tensor.chunks.len(), 1);
        let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
        let (w, n) = (tensor.dtype.size() as usize, c.element_count as usize);
        let contexts = base_contexts_of(g, file, t);
        let (mut chunk, mut at) = (Vec::new(), 0);
        for _ in 0..w {
            let Ok((records, next)) = tpde_codec::planes::parse(c.codec, stored, at, 1, n) else {
                break; // not a plane tag: left as it is
            };
            match &records[0] {
                PlaneRecord::BaseContexts(model, layout) => {
                    let tables: Vec<u8> = contexts.iter().map(|&k| model.map()[usize::from(k)]).collect();
                    let mut plane = vec![0u8; n];
                    model.decode_given(stored, layout, &tables, &mut plane).expect("valid");
                    chunk.push(7);
                    model.encode_given_blocks(&plane, &tables, &mut chunk);
                }
                _ => chunk.extend_from_slice(&stored[at..next]),
            }
            at = next;
        }
        if at > 0 {
            chunk.extend_from_slice(&stored[at..]);
            out = surgery::with_chunk(&out, t, 0, &chunk).expect("surgery");
        }
    }
    out
}

/// The base context (spec §6.4.1) of every element of tensor `t` of `file`, a delta against
/// [`BASE`].
pub(crate) fn base_contexts_of(g: &Gen, file: &[u8], t: usize) -> Vec<u8> {
    let dir = surgery::directory(file).expect("a valid file");
    let tensor = &dir.tensors[t];
    let base = g.get(BASE).tensors.iter().find(|b| b.name == tensor.name).expect("a base tensor");
    let mut contexts = Vec::new();
    tpde_codec::planes::base_contexts(tensor.dtype, &base.data, &mut contexts);
    contexts
}

/// Pair counts of (context 0, symbol): one table's histogram in row 0.
fn pairs_of(plane: &[u8]) -> Box<rans::context::Pairs> {
    rans::context::given_pair_counts(plane, &vec![0; plane.len()], false)
}

pub(crate) fn table_len(table: &Table) -> usize {
    let mut t = Vec::new();
    table.write(&mut t);
    t.len()
}

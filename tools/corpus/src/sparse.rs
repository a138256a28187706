//! Sparse plane records (spec §6.2.5) written by hand, for what `auto` never writes (issue 59):
//! mode 0x05 under each tag that allows it, fills other than a plane's commonest byte, both
//! position coders with both value records, a file that declares a version below the one it
//! uses; and invalid records that each break one condition of §6.2.5, checked by the isolation
//! rule (`isolation::broken_sparse_conditions`).
//!
//! A record's plane is taken from a valid chunk (its planes decoded), so a valid file made here
//! decodes to the content of the file it is derived from.

use tpde_codec::planes::{self, BaseElements};
use tpde_codec::rans::{self, Table};
use tpde_codec::PositionCoder;
use tpde_format::{surgery, CodecTag, DType, ErrorKind};

use crate::invalid::{bad_delta, edit_dir};
use crate::isolation::{assert_isolated_sparse, SparseParts};
use crate::reverse::REVERSE;
use crate::valid::{SPARSE_PLANES, SPARSE_PLANES_BASE};
use crate::Gen;

const SPARSE_PLANES_SUB: &str = "valid/delta-sparse-planes-sub.tpde";
const FILLS: &str = "valid/delta-sparse-planes-fills.tpde";

/// The state every rANS lane ends in (spec §6.2.2), and an idle lane keeps.
const FINAL_STATE: u32 = 1 << 23;

/// A chunk of a generated file: where it is, its tag, its element count, and its planes.
struct Chunk {
    tensor: usize,
    tag: CodecTag,
    planes: Vec<Vec<u8>>,
}

/// Chunk 0 of tensor `ti` of `file` (f32 elements), its planes decoded; `base`: the base file
/// for its base contexts, or None for a chunk with no mode-4 record.
fn chunk(g: &Gen, file: &str, ti: usize, base: Option<&str>) -> Chunk {
    let bytes = &g.get(file).bytes;
    let dir = surgery::directory(bytes).expect("a valid file");
    let t = &dir.tensors[ti];
    let c = &t.chunks[0];
    let stored = &bytes[c.offset as usize..(c.offset + c.stored_length) as usize];
    let n = c.element_count as usize;
    let base_data =
        base.map(|b| g.get(b).tensors.iter().find(|bt| bt.name == t.name).expect("base tensor").data.clone());
    let elements = base_data.as_ref().map(|d| BaseElements { dtype: DType::F32, elements: &d[..4 * n] });
    let mut out = vec![0u8; 4 * n];
    planes::decode(c.codec, stored, 0, 4, planes::Finish::Keep, elements, &mut out)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let planes = (0..4).map(|j| out.iter().skip(j).step_by(4).copied().collect()).collect();
    Chunk { tensor: ti, tag: c.codec, planes }
}

impl Chunk {
    fn n(&self) -> usize {
        self.planes[0].len()
    }

    /// Plane `j` as a sparse record of `fill`: every byte that differs from it listed.
    fn parts(&self, j: usize, fill: u8, coder: u8, values_mode: u8) -> SparseParts {
        let plane = &self.planes[j];
        let positions: Vec<u32> = (0..plane.len() as u32).filter(|&p| plane[p as usize] != fill).collect();
        let values = positions.iter().map(|&p| plane[p as usize]).collect();
        SparseParts { tag: self.tag, n: plane.len(), fill, positions, values, coder, values_mode, lanes: None }
    }

    /// The chunk's stored bytes: `sparse` records for their planes, every other plane stored
    /// (mode 0x00, which every tag allows).
    fn stored(&self, sparse: &[(usize, &SparseParts)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (j, plane) in self.planes.iter().enumerate() {
            match sparse.iter().find(|(k, _)| *k == j) {
                Some((_, parts)) => out.extend(record(parts)),
                None => {
                    out.push(0);
                    out.extend_from_slice(plane);
                }
            }
        }
        out
    }
}

/// A sparse record as its parts say, the broken ones too: coder byte 2 codes its positions as
/// packed; `values_mode` 1, 2 or 6 codes the values with one table (mode 2 in `lanes` lanes, the
/// extra ones idle, if given).
pub fn record(p: &SparseParts) -> Vec<u8> {
    let mut out = vec![5, p.fill];
    out.extend((p.positions.len() as u32).to_le_bytes());
    out.push(p.coder);
    let mut positions = Vec::new();
    let coder = if p.coder == 0 { PositionCoder::Rice } else { PositionCoder::Packed };
    coder.encode(&p.positions, &mut positions);
    out.extend((positions.len() as u32).to_le_bytes());
    out.extend(positions);
    out.push(p.values_mode);
    if p.values_mode == 0 {
        out.extend(&p.values);
        return out;
    }
    let hist = rans::histogram(&p.values);
    assert!(hist.iter().filter(|&&k| k > 0).count() >= 2, "a table needs two symbols (§6.2.1)");
    let table = Table::from_histogram(&hist);
    table.write(&mut out);
    match p.values_mode {
        1 => rans::encode(&table, &p.values, &mut out),
        6 => rans::encode_blocks(&table, &p.values, &mut out),
        _ => {
            let mut lanes = Vec::new();
            rans::encode_lanes(&table, &p.values, &mut lanes);
            out.extend(with_idle_lanes(&lanes, p.lanes));
        }
    }
    out
}

/// A one-lane record (spec §6.2.3) of at most one word given `total` lanes: the others own no
/// word, so they have no bytes and keep the final state.
fn with_idle_lanes(record: &[u8], total: Option<u32>) -> Vec<u8> {
    let Some(total) = total else { return record.to_vec() };
    assert_eq!(record[..4], 1u32.to_le_bytes(), "one lane to widen");
    let (state, end, bytes) = (&record[4..8], &record[8..12], &record[12..]);
    let mut out = total.to_le_bytes().to_vec();
    out.extend(state);
    (1..total).for_each(|_| out.extend(FINAL_STATE.to_le_bytes()));
    (0..total).for_each(|_| out.extend(end));
    out.extend(bytes);
    out
}

/// `file` with chunk 0 of `c`'s tensor replaced.
fn with_chunk(g: &Gen, file: &str, c: &Chunk, stored: &[u8]) -> Vec<u8> {
    surgery::with_chunk(&g.get(file).bytes, c.tensor, 0, stored).expect("surgery")
}

pub fn valid(g: &mut Gen) {
    // delta-xor-context (0x000E): fills that are not a plane's commonest byte, m = n, a listed
    // 0x00, both coders with both value records.
    let a = chunk(g, SPARSE_PLANES, 0, Some(SPARSE_PLANES_BASE));
    let b = chunk(g, SPARSE_PLANES, 1, Some(SPARSE_PLANES_BASE));
    let c = chunk(g, SPARSE_PLANES, 2, Some(SPARSE_PLANES_BASE));
    let cases = [
        (&a, 3, a.parts(3, 0x5A, 1, 0)), // a constant 0x00 plane: all n positions listed
        (&b, 0, b.parts(0, 0xC3, 0, 2)), // random low bytes: almost all listed, a lane record
        (&c, 1, c.parts(1, 0x02, 1, 2)), // bits 0x00 and 0x01: all n listed
    ];
    let mut file = g.get(SPARSE_PLANES).bytes.clone();
    for (chunk, j, parts) in &cases {
        assert_isolated_sparse(FILLS, parts, None);
        file = surgery::with_chunk(&file, chunk.tensor, 0, &chunk.stored(&[(*j, parts)])).expect("surgery");
    }
    assert_eq!(cases[0].2.positions.len(), a.n(), "m = n");
    g.valid_derived(
        FILLS,
        "§6.2.5",
        "delta-sparse-planes with planes recoded by hand (delta-xor-context): a constant 0x00 top plane as fill 0x5A listing all n positions (packed, stored bytes), a low plane of random bytes as fill 0xC3 (Golomb-Rice, a lane record), a plane of 0x00 and 0x01 as fill 0x02 (packed, a lane record)",
        SPARSE_PLANES,
        file.clone(),
    );
    // The same records in a file that declares 1.7, below the 1.8 that defines them: a reader
    // judges each record by itself, never by the declared version (§11).
    let older = surgery::with_header(&file, |h| h.minor_version = 7).expect("surgery");
    g.valid_derived(
        "valid/delta-sparse-planes-declared-1-7.tpde",
        "§11",
        "delta-sparse-planes-fills declaring version 1.7: sparse records (1.8) and a lower declared version, which a reader must not reject",
        SPARSE_PLANES,
        older,
    );

    // delta-sub-context (0x000F): plane 0 (0x01 but 16 listed 0x00s) as fill 0x07, all n
    // listed, two values (Golomb-Rice, a lane record); the top plane as fill 0xFF (packed,
    // stored).
    let s = chunk(g, SPARSE_PLANES_SUB, 0, Some(SPARSE_PLANES_BASE));
    let (p0, p3) = (s.parts(0, 0x07, 0, 2), s.parts(3, 0xFF, 1, 0));
    let path = "valid/delta-sparse-planes-sub-coders.tpde";
    assert_isolated_sparse(path, &p0, None);
    assert_isolated_sparse(path, &p3, None);
    let file = with_chunk(g, SPARSE_PLANES_SUB, &s, &s.stored(&[(0, &p0), (3, &p3)]));
    g.valid_derived(
        path,
        "§6.2.5",
        "delta-sparse-planes-sub with planes recoded by hand (delta-sub-context): plane 0 as fill 0x07 listing all n positions (Golomb-Rice, a lane record of 0x01 and 0x00), the top plane as fill 0xFF (packed, stored bytes)",
        SPARSE_PLANES_SUB,
        file,
    );

    // delta-predicted (0x0010, since 1.9): a chunk whose records need no base context.
    let dir = surgery::directory(&g.get(REVERSE).bytes).expect("valid");
    let ti = dir
        .tensors
        .iter()
        .position(|t| t.chunks[0].codec == CodecTag::DeltaPredicted && t.dtype == DType::F32)
        .expect("a predicted tensor");
    let p = chunk(g, REVERSE, ti, None);
    let (q1, q2) = (p.parts(1, 0x33, 1, 2), p.parts(2, 0x80, 0, 0));
    let path = "valid/delta-predicted-sparse-fills.tpde";
    assert_isolated_sparse(path, &q1, None);
    assert_isolated_sparse(path, &q2, None);
    let file = with_chunk(g, REVERSE, &p, &p.stored(&[(1, &q1), (2, &q2)]));
    g.valid_derived(
        path,
        "§6.2.5",
        "delta-predicted-reverse with one predicted chunk's planes recoded by hand: plane 1 as fill 0x33 (packed, a lane record), plane 2 as fill 0x80 (Golomb-Rice, stored bytes)",
        REVERSE,
        file,
    );
}

pub fn invalid(g: &mut Gen) {
    let c = chunk(g, FILLS, 2, Some(SPARSE_PLANES_BASE));
    let good = c.parts(1, 0x02, 1, 2);
    assert!(good.values.len() > 8, "room to break");
    let n = c.n();
    // Four listed bytes of two values at the start of the plane: one word, one lane.
    let small = SparseParts { positions: vec![3, 10, 20, 30], values: vec![0x10, 0x20, 0x10, 0x20], ..good.clone() };
    let cases: Vec<(&str, &str, &str, SparseParts)> = vec![
        (
            "r25-sparse-plane-value-is-fill-nonzero",
            "value is not the fill",
            "a sparse record of fill 0x02 that lists a 0x02 (a reader that forbids only listed zeros lets it pass)",
            {
                let mut p = good.clone();
                p.values[5] = p.fill;
                p
            },
        ),
        (
            "r25-sparse-plane-coder-2-packed",
            "coder is 0 or 1",
            "a sparse record whose coder byte is 2 and whose positions are valid packed blocks",
            SparseParts { coder: 2, ..good.clone() },
        ),
        (
            "r25-sparse-plane-position-at-n",
            "positions below n",
            "a sparse record whose Golomb-Rice positions increase to n, one past the plane",
            {
                let mut p = SparseParts { coder: 0, ..good.clone() };
                *p.positions.last_mut().unwrap() = n as u32;
                p
            },
        ),
        (
            "r25-sparse-plane-values-serial",
            "values of mode 0x00 or 0x02",
            "a sparse record whose listed bytes are a serial rANS stream (mode 0x01), valid as one",
            SparseParts { values_mode: 1, ..good.clone() },
        ),
        (
            "r25-sparse-plane-values-blocks",
            "values of mode 0x00 or 0x02",
            "a sparse record whose listed bytes are rANS blocks (mode 0x06), valid as such",
            SparseParts { values_mode: 6, ..good.clone() },
        ),
        (
            "r25-sparse-plane-values-lanes-over-m",
            "values' lanes at most max(1, ⌈m/4⌉)",
            "a sparse record of 4 listed bytes in a lane record of 2 lanes (the bound is max(1, ⌈m/4⌉) = 1; ⌈n/4⌉ would allow it)",
            SparseParts { lanes: Some(2), ..small.clone() },
        ),
    ];
    for (name, condition, description, parts) in cases {
        assert_isolated_sparse(name, &parts, Some(condition));
        let bytes = with_chunk(g, FILLS, &c, &c.stored(&[(1, &parts)]));
        bad_delta(g, name, "R25", description, bytes, SPARSE_PLANES_BASE, ErrorKind::Malformed);
    }
    // The record under a serial delta tag: every other plane stored, which the tag allows.
    let name = "r25-sparse-plane-serial-tag";
    let parts = SparseParts { tag: CodecTag::DeltaXor, ..good };
    assert_isolated_sparse(name, &parts, Some("a tag that allows mode 0x05"));
    let bytes = with_chunk(g, FILLS, &c, &c.stored(&[(1, &parts)]));
    let bytes = edit_dir(&bytes, |d| d.tensors[c.tensor].chunks[0].codec = CodecTag::DeltaXor);
    let description =
        "a chunk of stored planes and a sparse record, tagged delta-xor (serial, 0x0003), which has no mode 5";
    bad_delta(g, name, "R25", description, bytes, SPARSE_PLANES_BASE, ErrorKind::Malformed);
}

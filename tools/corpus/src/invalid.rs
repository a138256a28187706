//! `invalid/`: one file (or more) per rejection rule of spec §9, each a valid file with one
//! thing broken and its checksums resealed, so that only the rule under test can catch it.

use tpde_format::{
    surgery, BaseRef, CodecTag, DType, Directory, ErrorKind, Header, MetadataEntry, MetadataValue, Prediction,
    RequiredFeatures, TensorEntry, Trailer,
};

use crate::valid::{
    CONTEXT_BASE, CONTEXT_F32, DELTA_BASE, DELTA_PACKED, DELTA_SUB_CONTEXT, DELTA_XOR, FILES, LANES_F32, LANES_PACKED,
    PREDICTED, PREDICTED_BASE, PREDICTED_CHAIN, PREDICTED_CONTEXTS, PREDICTED_EDGE_BASE, PREDICTED_SUBNORMAL,
    SMALL_PLANES, SMALL_RAW, SMALL_ZSTD, SPARSE_PLANES, SPARSE_PLANES_BASE,
};
use crate::Gen;
use tpde_codec::planes::PlaneRecord;
use tpde_codec::positions::PositionCoder;
use tpde_codec::ChunkContext;
use tpde_conformance::{Case, Expect};

use ErrorKind::*;

pub fn all(g: &mut Gen) {
    envelope(g);
    directory(g);
    chunks(g);
    codecs(g);
    bases(g);
    lanes(g);
    contexts(g);
    base_contexts(g);
    single_rule(g);
    predicted(g);
    predicted_edges(g);
    files(g);
    sparse_planes(g);
}

/// The manifest entry of `invalid/{name}.tpde`, read on its own.
fn case(name: &str, rule: &str, description: &str, error: ErrorKind) -> Case {
    let expect = Expect::Invalid { error: error.as_str().into() };
    crate::case(&format!("invalid/{name}.tpde"), rule, description, expect)
}

/// An invalid file read on its own.
pub(crate) fn bad(g: &mut Gen, name: &str, rule: &str, description: &str, bytes: Vec<u8>, error: ErrorKind) {
    g.invalid(case(name, rule, description, error), bytes);
}

/// An invalid delta file read against `base`.
pub(crate) fn bad_delta(
    g: &mut Gen,
    name: &str,
    rule: &str,
    description: &str,
    bytes: Vec<u8>,
    base: &str,
    error: ErrorKind,
) {
    g.invalid(Case { base: Some(base.into()), ..case(name, rule, description, error) }, bytes);
}

/// An invalid delta file whose base is looked for through its path hints.
fn bad_via_hint(g: &mut Gen, name: &str, description: &str, bytes: Vec<u8>, error: ErrorKind) {
    g.invalid(Case { follow_hints: true, ..case(name, "R29", description, error) }, bytes);
}

pub(crate) fn edit_dir(file: &[u8], edit: impl FnOnce(&mut Directory)) -> Vec<u8> {
    surgery::with_directory(file, edit).expect("surgery on a valid file")
}

fn edit_dir_bytes(file: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    surgery::with_directory_bytes(file, edit).expect("surgery on a valid file")
}

fn edit_header(file: &[u8], edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    surgery::with_header(file, edit).expect("surgery on a valid file")
}

fn edit_trailer(file: &[u8], edit: impl FnOnce(&mut Trailer)) -> Vec<u8> {
    surgery::with_trailer(file, edit).expect("surgery on a valid file")
}

fn dir_offset(file: &[u8]) -> usize {
    surgery::directory_offset(file).expect("a valid file")
}

fn dir(file: &[u8]) -> Directory {
    surgery::directory(file).expect("a valid file")
}

/// Where `needle` starts in the directory of `file` (as an offset into the directory).
fn find_in_dir(file: &[u8], needle: &[u8]) -> usize {
    let dir = &file[dir_offset(file)..file.len() - 32];
    dir.windows(needle.len()).position(|w| w == needle).expect("needle in the directory")
}

/// Header and trailer: R1–R11.
fn envelope(g: &mut Gen) {
    let small = g.get(SMALL_RAW).bytes.clone();
    let mut zip = small.clone();
    zip[..4].copy_from_slice(b"PK\x03\x04");
    bad(g, "r01-zip-magic", "R1", "a ZIP signature where the magic belongs", zip, NotTpde);
    bad(g, "r01-empty", "R1", "an empty file", Vec::new(), NotTpde);
    bad(g, "r01-text", "R1", "a short text file", b"hello, world\n".to_vec(), NotTpde);
    let mut magic = small.clone();
    magic[7] = 0x0a;
    bad(g, "r01-magic-last-byte", "R1", "the magic's last byte changed (a text-mode transfer)", magic, NotTpde);
    bad(g, "r02-major-2", "R2", "major version 2", edit_header(&small, |h| h.major_version = 2), UnsupportedVersion);
    bad(g, "r02-major-0", "R2", "major version 0", edit_header(&small, |h| h.major_version = 0), UnsupportedVersion);
    let mut crc = small.clone();
    crc[20] ^= 1;
    bad(g, "r03-header-crc", "R3", "a flipped bit in the header's flags, CRC not updated", crc, ChecksumMismatch);
    bad(
        g,
        "r04-unknown-required-feature",
        "R4",
        "must-understand feature bit 5, which no 1.x reader knows",
        edit_header(&small, |h| h.required_features |= 1 << 5),
        UnsupportedFeature,
    );
    bad(g, "r05-truncated-in-header", "R5", "the first 40 bytes of a file", small[..40].to_vec(), Truncated);
    bad(g, "r05-no-room-for-trailer", "R5", "a header and 16 more bytes", small[..80].to_vec(), Truncated);
    // P3: a file of 64 to 95 bytes is judged by its header first (issue 69).
    let mut short = small[..80].to_vec();
    short[60] ^= 1;
    bad(
        g,
        "r03-header-crc-in-80-bytes",
        "R3",
        "a header and 16 more bytes, header_crc32 flipped: R3 before R5's 96 bytes (P3)",
        short,
        ChecksumMismatch,
    );
    let at = dir_offset(&small);
    bad(g, "r06-truncated-in-trailer", "R6", "the last byte missing", small[..small.len() - 1].to_vec(), Truncated);
    bad(
        g,
        "r06-truncated-in-directory",
        "R6",
        "cut in the middle of the directory",
        small[..at + 20].to_vec(),
        Truncated,
    );
    bad(g, "r06-truncated-in-chunk", "R6", "cut in the middle of the chunk payloads", small[..300].to_vec(), Truncated);
    let mut trailer = small.clone();
    let n = trailer.len();
    trailer[n - 30] ^= 1;
    bad(
        g,
        "r07-trailer-crc",
        "R7",
        "a flipped bit in the directory offset, trailer CRC not updated",
        trailer,
        ChecksumMismatch,
    );
    bad(
        g,
        "r08-reserved-nonzero",
        "R8",
        "a reserved header byte set",
        edit_header(&small, |h| h.reserved[3] = 1),
        Malformed,
    );
    bad(
        g,
        "r08-alignment-100",
        "R8",
        "alignment 100, not a power of two",
        edit_header(&small, |h| h.alignment = 100),
        Malformed,
    );
    bad(g, "r08-alignment-32", "R8", "alignment 32, under 64", edit_header(&small, |h| h.alignment = 32), Malformed);
    bad(
        g,
        "r08-alignment-2mib",
        "R8",
        "alignment 2 MiB, over 1 MiB",
        edit_header(&small, |h| h.alignment = 2 << 20),
        Malformed,
    );
    bad(
        g,
        "r09-directory-too-long",
        "R9",
        "a trailer declaring a 300 MiB directory (over the 256 MiB limit)",
        edit_trailer(&small, |t| t.directory_length = 300 << 20),
        LimitExceeded,
    );
    bad(
        g,
        "r09-directory-length-overflows",
        "R9",
        "a directory length of 2^64 − 1",
        edit_trailer(&small, |t| t.directory_length = u64::MAX),
        LimitExceeded,
    );
    let end = small.len() as u64 - 32;
    bad(
        g,
        "r10-directory-overlaps-header",
        "R10",
        "a directory offset of 32, inside the header",
        edit_trailer(&small, |t| {
            t.directory_offset = 32;
            t.directory_length = end - 32;
        }),
        Malformed,
    );
    bad(
        g,
        "r10-directory-short-of-trailer",
        "R10",
        "a directory that ends one byte before the trailer",
        edit_trailer(&small, |t| t.directory_length -= 1),
        Malformed,
    );
    let mut dir_crc = small.clone();
    dir_crc[at + 2] ^= 1;
    bad(
        g,
        "r11-directory-crc",
        "R11",
        "a flipped bit in the directory, its CRC not updated",
        dir_crc,
        ChecksumMismatch,
    );
}

/// The directory's syntax and semantics: R12–R20.
fn directory(g: &mut Gen) {
    let small = g.get(SMALL_RAW).bytes.clone();
    bad(g, "r12-base-kind-2", "R12", "base_kind 2", edit_dir_bytes(&small, |d| d[8] = 2), Malformed);
    bad(
        g,
        "r12-trailing-byte",
        "R12",
        "a byte after the last tensor entry",
        edit_dir_bytes(&small, |d| d.push(0)),
        Malformed,
    );
    bad(
        g,
        "r12-count-past-end",
        "R12",
        "a tensor count of 2^32 − 1, far past the directory's end",
        edit_dir_bytes(&small, |d| d[4..8].copy_from_slice(&u32::MAX.to_le_bytes())),
        Malformed,
    );
    bad(
        g,
        "r12-key-not-utf8",
        "R12",
        "a metadata key that is not UTF-8 (0xff)",
        edit_dir_bytes(&small, |d| d[9 + 2] = 0xff),
        Malformed,
    );
    let scalar = find_in_dir(&small, b"scalar");
    bad(
        g,
        "r12-name-not-utf8",
        "R12",
        "a tensor name that is not UTF-8 (a lone continuation byte)",
        edit_dir_bytes(&small, |d| d[scalar] = 0x80),
        Malformed,
    );
    let flag = find_in_dir(&small, b"flag") + 4;
    bad(
        g,
        "r12-bool-not-0-or-1",
        "R12",
        "a bool metadata value of 2",
        edit_dir_bytes(&small, |d| d[flag + 5] = 2),
        Malformed,
    );
    let step = find_in_dir(&small, b"tpde.step") + 9;
    bad(
        g,
        "r12-u64-of-7-bytes",
        "R12",
        "a u64 metadata value 7 bytes long",
        edit_dir_bytes(&small, |d| {
            d[step + 1..step + 5].copy_from_slice(&7u32.to_le_bytes());
            d.remove(step + 5);
        }),
        Malformed,
    );
    // dtype, rank (a scalar has no dims), byte_length, digest, chunk_count, then the chunk
    // entry's five u64 and crc32 before its codec tag.
    let dtype_at = scalar + 6;
    let codec_at = dtype_at + 2 + 8 + 32 + 4 + 44;
    bad(
        g,
        "r13-unknown-dtype",
        "R13",
        "dtype code 0x7e",
        edit_dir_bytes(&small, |d| d[dtype_at] = 0x7e),
        UnsupportedFeature,
    );
    bad(
        g,
        "r14-unknown-codec",
        "R14",
        "codec tag 0x1234",
        edit_dir_bytes(&small, |d| d[codec_at..codec_at + 2].copy_from_slice(&[0x34, 0x12])),
        UnsupportedFeature,
    );
    let limits = [
        ("r15-name-too-long", "a tensor name of 4097 bytes", LimitCase::Name),
        ("r15-key-too-long", "a metadata key of 1025 bytes", LimitCase::Key),
        ("r15-rank-33", "a rank of 33", LimitCase::Rank),
        ("r15-params-too-long", "codec params of 1025 bytes", LimitCase::Params),
        ("r15-chunk-too-long", "a chunk decoding to 2 GiB (the limit is 1 GiB)", LimitCase::Chunk),
        ("r15-stored-too-long", "a chunk stored in 1 GiB + 1 MiB + 1 bytes, one over the limit", LimitCase::Stored),
    ];
    for (path, description, case) in limits {
        bad(g, path, "R15", description, edit_dir(&small, |d| case.apply(d)), LimitExceeded);
    }
    // P5: a rank over its limit before the bytes its dims would need (issue 69: a reader that
    // reads the dims first says `malformed`).
    let rank_at = dtype_at + 1;
    bad(
        g,
        "r15-rank-40-past-the-end",
        "R15",
        "a rank of 40 with 60 directory bytes after it: the limit before the bytes (P5)",
        edit_dir_bytes(&small, |d| {
            d[rank_at] = 40;
            d.truncate(rank_at + 1 + 60);
        }),
        LimitExceeded,
    );
    // P5: a count against the bytes left at its entries' fixed part (7 bytes a metadata entry,
    // 48 a tensor entry), before any entry is read. Each count fits at one byte less a fixed
    // part, and its first entry opens with a length over its limit: a reader that checks the
    // count otherwise (or not at all) reads that length and says `limit-exceeded`.
    let directory = |metadata: u32, tensors: u32, first: &[u8], len: usize| {
        let mut d = [metadata.to_le_bytes(), tensors.to_le_bytes()].concat();
        d.push(0); // no base
        d.extend_from_slice(first);
        d.resize(9 + len, 0);
        d
    };
    for (path, description, bytes) in [
        (
            "r12-metadata-count-fixed-part",
            "58 metadata entries with 400 directory bytes after the counts and base kind: 58 × 7 > 400 (58 × 6 would fit); the first entry's key length is 2000, over its limit",
            directory(58, 0, &2000u16.to_le_bytes(), 400),
        ),
        (
            "r12-tensor-count-fixed-part",
            "51 tensors with 2400 directory bytes after the counts and base kind: 51 × 48 > 2400 (51 × 47 would fit); the first entry's name length is 5000, over its limit",
            directory(0, 51, &5000u16.to_le_bytes(), 2400),
        ),
    ] {
        bad(g, path, "R12", description, edit_dir_bytes(&small, |d| *d = bytes), Malformed);
    }
    let delta = g.get(DELTA_XOR).bytes.clone();
    bad_delta(
        g,
        "r15-hint-too-long",
        "R15",
        "a base path hint of 4097 bytes",
        edit_dir(&delta, |d| d.base.as_mut().unwrap().path_hint = "h".repeat(4097)),
        DELTA_BASE,
        LimitExceeded,
    );
    bad(
        g,
        "r16-base-flag-without-base",
        "R16",
        "the BASE flag set, no base reference",
        edit_header(&small, |h| h.required_features |= RequiredFeatures::BASE),
        Malformed,
    );
    bad(
        g,
        "r16-base-without-flag",
        "R16",
        "a base reference, the BASE flag clear",
        edit_dir(&small, |d| d.base = Some(BaseRef { digest: [7; 32], path_hint: "b.tpde".into() })),
        Malformed,
    );
    bad(g, "r17-empty-name", "R17", "a tensor named \"\"", edit_dir(&small, |d| d.tensors[1].name.clear()), Malformed);
    bad(
        g,
        "r17-duplicate-name",
        "R17",
        "two tensors named \"ramp\"",
        edit_dir(&small, |d| d.tensors[1].name = d.tensors[0].name.clone()),
        Malformed,
    );
    bad(
        g,
        "r17-duplicate-key",
        "R17",
        "the metadata key \"flag\" twice",
        edit_dir(&small, |d| d.metadata.push(MetadataEntry::new("flag", MetadataValue::Bool(false)))),
        Malformed,
    );
    bad(
        g,
        "r17-empty-key",
        "R17",
        "a metadata key \"\"",
        edit_dir(&small, |d| d.metadata.push(MetadataEntry::new("", MetadataValue::Bool(false)))),
        Malformed,
    );
    bad(
        g,
        "r17-reserved-key-type",
        "R17",
        "tpde.step as an i64 (the spec says u64)",
        edit_dir(&small, |d| d.metadata[0].value = MetadataValue::I64(42)),
        Malformed,
    );
    bad(
        g,
        "r18-byte-length",
        "R18",
        "byte_length 4 more than shape × dtype size",
        edit_dir(&small, |d| d.tensors[0].byte_length += 4),
        Malformed,
    );
    bad(
        g,
        "r18-shape-overflows-u64",
        "R18",
        "a shape whose element count overflows 64 bits",
        edit_dir(&small, |d| d.tensors[0].shape = vec![u64::MAX, u64::MAX]),
        Malformed,
    );
    bad(
        g,
        "r18-byte-length-overflows-u64",
        "R18",
        "a shape whose byte length (not element count) overflows 64 bits",
        edit_dir(&small, |d| d.tensors[0].shape = vec![1 << 62]),
        Malformed,
    );
    bad(
        g,
        "r19-gap",
        "R19",
        "chunk 1 starts one element late",
        edit_dir(&small, |d| d.tensors[0].chunks[1].element_start += 1),
        Malformed,
    );
    bad(
        g,
        "r19-overlap",
        "R19",
        "chunk 1 starts one element early",
        edit_dir(&small, |d| d.tensors[0].chunks[1].element_start -= 1),
        Malformed,
    );
    bad(
        g,
        "r19-short",
        "R19",
        "the last chunk missing: the chunks cover fewer elements than the shape",
        edit_dir(&small, |d| {
            d.tensors[0].chunks.pop();
        }),
        Malformed,
    );
    bad(
        g,
        "r19-empty-chunk",
        "R19",
        "a chunk of zero elements",
        edit_dir(&small, |d| {
            let mut c = d.tensors[0].chunks[1].clone();
            c.element_count = 0;
            c.decoded_length = 0;
            c.stored_length = 0;
            c.crc32 = crc32fast::hash(&[]);
            d.tensors[0].chunks.insert(1, c);
        }),
        Malformed,
    );
    bad(
        g,
        "r19-chunks-on-empty-tensor",
        "R19",
        "a tensor of zero elements that lists a chunk",
        edit_dir(&small, |d| {
            let c = d.tensors[1].chunks[0].clone();
            d.tensors[2].chunks.push(c);
        }),
        Malformed,
    );
    bad(
        g,
        "r20-decoded-length",
        "R20",
        "a chunk whose decoded_length is 4 short of its elements",
        edit_dir(&small, |d| d.tensors[0].chunks[0].decoded_length -= 4),
        Malformed,
    );
}

enum LimitCase {
    Name,
    Key,
    Rank,
    Params,
    Chunk,
    Stored,
}

impl LimitCase {
    fn apply(&self, d: &mut Directory) {
        match self {
            LimitCase::Name => d.tensors[1].name = "n".repeat(4097),
            LimitCase::Key => d.metadata[1].key = "k".repeat(1025),
            LimitCase::Rank => d.tensors[2].shape = vec![0; 33],
            LimitCase::Params => d.tensors[0].chunks[0].params = vec![0; 1025],
            LimitCase::Chunk => claim_one_chunk(d, 1 << 29),
            LimitCase::Stored => d.tensors[0].chunks[0].stored_length = tpde_format::limits::MAX_CHUNK_STORED_LEN + 1,
        }
    }
}

/// Makes tensor 0 (f32) one chunk, its first, claiming to decode to `elements`.
fn claim_one_chunk(d: &mut Directory, elements: u64) {
    let t = &mut d.tensors[0];
    t.shape = vec![elements];
    t.byte_length = elements * 4;
    t.chunks.truncate(1);
    t.chunks[0].element_count = elements;
    t.chunks[0].decoded_length = elements * 4;
}

/// Chunk placement and integrity: R21–R24, R26, R27.
fn chunks(g: &mut Gen) {
    let small = g.get(SMALL_RAW).bytes.clone();
    bad(
        g,
        "r21-unaligned",
        "R21",
        "a chunk offset one past a multiple of the alignment",
        edit_dir(&small, |d| d.tensors[0].chunks[0].offset += 1),
        Malformed,
    );
    bad(
        g,
        "r21-past-payload",
        "R21",
        "a chunk at 1 TiB, past the end of the file",
        edit_dir(&small, |d| d.tensors[0].chunks[0].offset = 1 << 40),
        Malformed,
    );
    bad(
        g,
        "r21-offset-overflows-u64",
        "R21",
        "a chunk whose offset + stored length overflows 64 bits",
        edit_dir(&small, |d| d.tensors[0].chunks[0].offset = u64::MAX - 63),
        Malformed,
    );
    bad(
        g,
        "r21-into-directory",
        "R21",
        "a chunk that runs into the directory",
        edit_dir(&small, |d| {
            let last = d.tensors[3].chunks.last_mut().unwrap();
            last.offset += 128;
        }),
        Malformed,
    );
    bad(
        g,
        "r22-overlapping-chunks",
        "R22",
        "two chunks whose stored ranges overlap without being the same",
        edit_dir(&small, |d| d.tensors[0].chunks[1].offset = d.tensors[0].chunks[0].offset + 64),
        Malformed,
    );
    bad(
        g,
        "r23-raw-stored-length",
        "R23",
        "a raw chunk whose stored length differs from its decoded length",
        edit_dir(&small, |d| d.tensors[0].chunks[0].stored_length -= 4),
        Malformed,
    );
    let zstd = g.get(SMALL_ZSTD).bytes.clone();
    bad(
        g,
        "r23-zstd-expansion",
        "R23",
        "a zstd chunk claiming to decode to 4 MiB, more than 32768 times its size",
        edit_dir(&zstd, |d| claim_one_chunk(d, 1 << 20)),
        Malformed,
    );
    let planes = g.get(SMALL_PLANES).bytes.clone();
    bad(
        g,
        "r23-planes-expansion",
        "R23",
        "a planes chunk claiming to decode to 1 GiB, more than 32768 times its size",
        edit_dir(&planes, |d| claim_one_chunk(d, 1 << 28)),
        Malformed,
    );
    let mut flipped = small.clone();
    let ramp1 = dir(&small).tensors[0].chunks[1].offset;
    flipped[ramp1 as usize + 3] ^= 0x10;
    bad(g, "r24-chunk-crc", "R24", "a flipped bit in a chunk, its CRC not updated", flipped, ChecksumMismatch);
    bad(
        g,
        "r26-digest",
        "R26",
        "a tensor digest that does not match its bytes (chunk CRCs all match)",
        edit_dir(&small, |d| d.tensors[0].digest[0] ^= 1),
        ChecksumMismatch,
    );
    let dir = dir(&small);
    let c = &dir.tensors[1].chunks[0];
    let mut padding = small.clone();
    padding[(c.offset + c.stored_length) as usize] = 1;
    bad(g, "r27-padding", "R27", "a non-zero byte in the padding after a chunk", padding, Malformed);
}

/// R25: stored bytes a codec cannot decode to exactly the decoded length; R28.
fn codecs(g: &mut Gen) {
    let small = g.get(SMALL_RAW).bytes.clone();
    bad(
        g,
        "r25-raw-params",
        "R25",
        "params on a raw chunk, which takes none",
        edit_dir(&small, |d| d.tensors[0].chunks[0].params = vec![1]),
        Malformed,
    );
    let zstd = g.get(SMALL_ZSTD).bytes.clone();
    let chunk =
        |file: &[u8], tensor, chunk, stored: &[u8]| surgery::with_chunk(file, tensor, chunk, stored).expect("surgery");
    bad(
        g,
        "r25-zstd-not-a-frame",
        "R25",
        "a zstd chunk that is not a zstd frame",
        chunk(&zstd, 0, 0, b"not a zstd frame"),
        Malformed,
    );
    let short = zstd::bulk::compress(&[0u8; 16], 3).expect("zstd");
    bad(
        g,
        "r25-zstd-decodes-short",
        "R25",
        "a zstd frame of 16 bytes where the chunk decodes to 128",
        chunk(&zstd, 0, 0, &short),
        Malformed,
    );
    let long = zstd::bulk::compress(&[0u8; 200], 3).expect("zstd");
    bad(
        g,
        "r25-zstd-decodes-long",
        "R25",
        "a zstd frame of 200 bytes where the chunk decodes to 128",
        chunk(&zstd, 0, 0, &long),
        Malformed,
    );

    // A planes chunk of the u8 tensor: one plane record, rANS-coded.
    let planes = g.get(SMALL_PLANES).bytes.clone();
    let dir = dir(&planes);
    let c = &dir.tensors[3].chunks[0];
    let stored = planes[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    assert_eq!(stored[0], 1, "the u8 plane is rANS-coded");
    let symbols: u32 = stored[1..33].iter().map(|b| b.count_ones()).sum();
    let stream_at = 33 + 2 * symbols as usize;
    let mut mode = stored.clone();
    mode[0] = 2;
    bad(g, "r25-plane-mode", "R25", "a plane record of mode 2", chunk(&planes, 3, 0, &mode), Malformed);
    let mut sum = stored.clone();
    sum[33] = sum[33].wrapping_add(1);
    bad(
        g,
        "r25-rans-table-sum",
        "R25",
        "a rANS frequency table summing to 4097",
        chunk(&planes, 3, 0, &sum),
        Malformed,
    );
    let mut zero = stored.clone();
    zero[33..35].copy_from_slice(&0u16.to_le_bytes());
    bad(
        g,
        "r25-rans-zero-frequency",
        "R25",
        "a rANS frequency of 0 for a present symbol",
        chunk(&planes, 3, 0, &zero),
        Malformed,
    );
    let mut state = stored.clone();
    state[stream_at + 4] ^= 0x40;
    bad(
        g,
        "r25-rans-state",
        "R25",
        "a rANS initial state changed: the end states are not 2^23",
        chunk(&planes, 3, 0, &state),
        Malformed,
    );
    let mut cut = stored.clone();
    let len = u32::from_le_bytes(cut[stream_at..stream_at + 4].try_into().unwrap());
    cut[stream_at..stream_at + 4].copy_from_slice(&(len + 1).to_le_bytes());
    bad(
        g,
        "r25-rans-stream-past-end",
        "R25",
        "a rANS stream length one past the chunk's end",
        chunk(&planes, 3, 0, &cut),
        Malformed,
    );
    let mut trailing = stored.clone();
    trailing.push(0);
    bad(
        g,
        "r25-planes-trailing-byte",
        "R25",
        "a byte after the last plane record",
        chunk(&planes, 3, 0, &trailing),
        Malformed,
    );

    // Sparse payloads (§6.5), hand-built, in place of chunk 0 of "w.f32" (2048 elements).
    let sparse = |count: u32, positions: &[u8], values: &[u32]| {
        let mut out = count.to_le_bytes().to_vec();
        out.extend((positions.len() as u32).to_le_bytes());
        out.extend_from_slice(positions);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tpde_codec::planes::encode(&bytes, 4, tpde_codec::PlaneForm::Serial, tpde_codec::Records::FIRST, &mut out);
        out
    };
    let packed = g.get(DELTA_PACKED).bytes.clone();
    let block = |first: u32, width: u8| [&first.to_le_bytes()[..], &[width]].concat();
    for (path, description, stored) in [
        (
            "r25-sparse-gap-0",
            "sparse-packed positions 5, 5: a gap of 0",
            sparse(2, &[block(5, 1), vec![0x00]].concat(), &[1, 1]),
        ),
        (
            "r25-sparse-position-past-end",
            "sparse-packed position 2048 in a chunk of 2048 elements",
            sparse(1, &block(2048, 0), &[1]),
        ),
        (
            "r25-sparse-value-0",
            "sparse-packed: an element listed as changed whose XOR value is 0",
            sparse(1, &block(3, 0), &[0]),
        ),
        (
            "r25-sparse-width-33",
            "sparse-packed: a block width of 33 bits",
            sparse(2, &[block(3, 33), vec![0; 5]].concat(), &[1, 1]),
        ),
        (
            "r25-sparse-count-over-n",
            "a count of 4096 changed elements in a chunk of 2048",
            sparse(4096, &block(0, 0), &[1]),
        ),
        ("r25-sparse-positions-past-end", "positions_len past the end of the chunk", {
            let mut s = sparse(1, &block(3, 0), &[1]);
            s[4..8].copy_from_slice(&1000u32.to_le_bytes());
            s
        }),
    ] {
        bad_delta(g, path, "R25", description, chunk(&packed, 0, 0, &stored), DELTA_BASE, Malformed);
    }
    let rice = g.get("valid/delta-sparse-rice.tpde").bytes.clone();
    // k = 0: gap 1 is "10"; a gap of 0 is "0".
    bad_delta(
        g,
        "r25-rice-gap-0",
        "R25",
        "sparse-rice gaps 1, 0 (k = 0)",
        chunk(&rice, 0, 0, &sparse(2, &[0, 0b1000_0000], &[1, 1])),
        DELTA_BASE,
        Malformed,
    );
    bad_delta(
        g,
        "r25-rice-k-32",
        "R25",
        "a sparse-rice parameter k of 32",
        chunk(&rice, 0, 0, &sparse(1, &[32, 0x80, 0, 0, 0, 0], &[1])),
        DELTA_BASE,
        Malformed,
    );
    let elias = g.get("valid/delta-sparse-elias-delta.tpde").bytes.clone();
    bad_delta(
        g,
        "r25-elias-delta-long-prefix",
        "R25",
        "an Elias-delta code with 16 leading zeros",
        chunk(&elias, 0, 0, &sparse(1, &[0, 0, 0x80], &[1])),
        DELTA_BASE,
        Malformed,
    );
    bad_delta(
        g,
        "r25-elias-delta-padding",
        "R25",
        "Elias-delta gap 1 followed by padding bits that are not zero",
        chunk(&elias, 0, 0, &sparse(1, &[0xff], &[1])),
        DELTA_BASE,
        Malformed,
    );
    bad_delta(
        g,
        "r25-elias-delta-count-past-stream",
        "R25",
        "a count of 3 and only two Elias-delta codes (gap 1, gap 1)",
        chunk(&elias, 0, 0, &sparse(3, &[0b1100_0000], &[1, 1, 1])),
        DELTA_BASE,
        Malformed,
    );
    let fib = g.get("valid/delta-sparse-fibonacci.tpde").bytes.clone();
    bad_delta(
        g,
        "r25-fibonacci-unterminated",
        "R25",
        "a Fibonacci code with no terminating 11 in 56 bits",
        chunk(&fib, 0, 0, &sparse(1, &[0; 7], &[1])),
        DELTA_BASE,
        Malformed,
    );

    bad(
        g,
        "r28-delta-codec-without-base",
        "R28",
        "a delta-xor chunk in a file with no base reference",
        edit_dir(&small, |d| d.tensors[0].chunks[0].codec = CodecTag::DeltaXor),
        Malformed,
    );
    bad(
        g,
        "r28-sparse-codec-without-base",
        "R28",
        "a sparse-packed chunk in a file with no base reference",
        edit_dir(&small, |d| d.tensors[3].chunks[0].codec = CodecTag::SparsePacked),
        Malformed,
    );
}

/// R29: the base a delta decodes against.
fn bases(g: &mut Gen) {
    let delta = g.get(DELTA_XOR).bytes.clone();
    bad(g, "r29-base-not-given", "R29", "valid/delta-xor.tpde read without its base", delta.clone(), BaseMissing);
    bad_via_hint(
        g,
        "r29-hinted-base-absent",
        "a delta whose path hint names a file that does not exist",
        edit_dir(&delta, |d| d.base.as_mut().unwrap().path_hint = "no-such-base.tpde".into()),
        BaseMissing,
    );
    bad_delta(
        g,
        "r29-wrong-base",
        "R29",
        "valid/delta-xor.tpde read against valid/small-raw.tpde: the content digests differ",
        delta.clone(),
        SMALL_RAW,
        BaseMismatch,
    );
    bad_delta(
        g,
        "r29-base-tensor-absent",
        "R29",
        "a delta tensor renamed, so the base has no tensor of its name",
        edit_dir(&delta, |d| d.tensors[0].name = "w.renamed".into()),
        DELTA_BASE,
        Malformed,
    );
    bad_delta(
        g,
        "r29-base-tensor-shape",
        "R29",
        "a delta tensor of shape [32, 64] against a base tensor of shape [64, 32]",
        edit_dir(&delta, |d| d.tensors[0].shape = vec![32, 64]),
        DELTA_BASE,
        Malformed,
    );
    let hint = |name: &str| edit_dir(&delta, |d| d.base.as_mut().unwrap().path_hint = name.into());
    bad_via_hint(
        g,
        "r29-chain-loop-a",
        "a delta whose base hint names r29-chain-loop-b.tpde, whose hint names this file",
        hint("r29-chain-loop-b.tpde"),
        BaseChain,
    );
    bad_via_hint(
        g,
        "r29-chain-loop-b",
        "the other half of the loop: its hint names r29-chain-loop-a.tpde",
        hint("r29-chain-loop-a.tpde"),
        BaseChain,
    );
    bad_via_hint(g, "r29-chain-self", "a delta whose base hint names itself", hint("r29-chain-self.tpde"), BaseChain);
}

/// The lane form's rules (§6.2.3), broken in the exponent plane of a `planes-lanes` chunk and in
/// the values of a `sparse-packed-lanes` one; and each plane mode under the other form's tag.
fn lanes(g: &mut Gen) {
    let chunk =
        |file: &[u8], tensor, chunk, stored: &[u8]| surgery::with_chunk(file, tensor, chunk, stored).expect("surgery");
    let file = g.get(LANES_F32).bytes.clone();
    let c = dir(&file).tensors[0].chunks[0].clone();
    let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    let n = c.element_count as usize;
    // The planes of an f32 chunk: three near-random mantissa planes stored, then the exponent.
    let at = 3 * (1 + n);
    assert!(stored[..at].iter().step_by(1 + n).all(|&m| m == 0), "mantissa planes are stored");
    assert_eq!(stored[at], 2, "the exponent plane is in lanes");
    let symbols: u32 = stored[at + 1..at + 33].iter().map(|b| b.count_ones()).sum();
    let lanes_at = at + 33 + 2 * symbols as usize;
    let lanes = u32::from_le_bytes(stored[lanes_at..lanes_at + 4].try_into().unwrap()) as usize;
    assert!(lanes >= 3, "several lanes");
    let (states, ends) = (lanes_at + 4, lanes_at + 4 + 4 * lanes);
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = stored.clone();
        f(&mut s);
        chunk(&file, 0, 0, &s)
    };
    let put = |s: &mut Vec<u8>, at: usize, v: u32| s[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let end = |k: usize| u32::from_le_bytes(stored[ends + 4 * k..ends + 4 * k + 4].try_into().unwrap());
    let cases: Vec<(&str, String, Vec<u8>)> = vec![
        ("r25-lanes-zero", "a plane record with 0 rANS lanes".into(), edit(&|s| put(s, lanes_at, 0))),
        (
            "r25-lanes-too-many",
            format!("{} rANS lanes for {n} symbols: more lanes than 4-symbol words", n.div_ceil(4) + 1),
            edit(&|s| put(s, lanes_at, n.div_ceil(4) as u32 + 1)),
        ),
        ("r25-lanes-end-decreasing", "lane 1 ends before lane 0 does".into(), edit(&|s| put(s, ends + 4, end(0) - 1))),
        (
            "r25-lanes-past-end",
            "the last lane's end one byte past the chunk".into(),
            edit(&|s| put(s, ends + 4 * (lanes - 1), end(lanes - 1) + 1)),
        ),
        (
            "r25-lanes-state",
            "lane 1's initial state changed: it does not end in state 2^23".into(),
            edit(&|s| s[states + 4 + 2] ^= 0x10),
        ),
        (
            "r25-lanes-short-lane",
            "lane 0 ends one byte early and lane 1 starts a byte early: both lanes misread".into(),
            edit(&|s| put(s, ends, end(0) - 1)),
        ),
        (
            "r25-lanes-serial-mode",
            "a planes-lanes chunk with a mode 1 (serial rANS) record".into(),
            edit(&|s| s[at] = 1),
        ),
        (
            "r25-serial-lanes-mode",
            "a planes chunk (0x0002) whose records are in lane form (mode 2)".into(),
            edit_dir(&file, |d| d.tensors[0].chunks[0].codec = CodecTag::Planes),
        ),
    ];
    for (path, description, bytes) in cases {
        bad(g, path, "R25", &description, bytes, Malformed);
    }
    // sparse-packed-lanes: the values' planes must be lanes and decode exactly.
    let packed = g.get(LANES_PACKED).bytes.clone();
    let c = dir(&packed).tensors[0].chunks[0].clone();
    let mut stored = packed[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    stored.push(0);
    bad_delta(
        g,
        "r25-sparse-lanes-trailing-byte",
        "R25",
        "a sparse-packed-lanes chunk with a byte after its last plane record",
        chunk(&packed, 0, 0, &stored),
        DELTA_BASE,
        Malformed,
    );
    bad_delta(
        g,
        "r25-sparse-lanes-serial-tag",
        "R25",
        "a sparse-packed-lanes chunk relabelled sparse-packed (0x0008): its lane records are not that tag's",
        edit_dir(&packed, |d| d.tensors[0].chunks[0].codec = CodecTag::SparsePacked),
        DELTA_BASE,
        Malformed,
    );
}

/// The context record's rules (§6.2.4), broken in the exponent plane of a `planes-context` chunk;
/// and mode 3 under the 1.2 keyframe lane tag.
fn contexts(g: &mut Gen) {
    let file = g.get(CONTEXT_F32).bytes.clone();
    let c = dir(&file).tensors[0].chunks[0].clone();
    let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    let n = c.element_count as usize;
    // The exponent plane's record (the last) starts where the one before it ends.
    let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, 4, n).expect("valid");
    let at = match &records[2] {
        PlaneRecord::Stored(at) => at + n,
        PlaneRecord::Lanes(_, layout) | PlaneRecord::Contexts(_, layout) => layout.bytes.end,
        PlaneRecord::Blocks(_, layout) | PlaneRecord::ContextBlocks(_, layout) => layout.words.end,
        PlaneRecord::Serial(..)
        | PlaneRecord::BaseContexts(..)
        | PlaneRecord::BaseContextBlocks(..)
        | PlaneRecord::Sparse(..) => {
            unreachable!("not a planes-context record")
        }
    };
    assert_eq!(stored[at], 3, "the exponent plane is a context record");
    let map = at + 1;
    let tables = usize::from(*stored[map..map + 256].iter().max().unwrap()) + 1;
    assert!(tables >= 4, "several tables");
    // Two symbols before that name different tables: swapping them keeps the record's
    // structure and sends symbols to the wrong tables.
    let a = (0..256).find(|&a| stored[map + a] != stored[map]).expect("two tables in use");
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = stored.clone();
        f(&mut s);
        surgery::with_chunk(&file, 0, 0, &s).expect("surgery")
    };
    let cases: Vec<(&str, String, Vec<u8>)> = vec![
        (
            "r25-context-map-entry",
            "a context map entry of 16: past the 16 tables a record may have".into(),
            edit(&|s| s[map + 7] = 16),
        ),
        (
            "r25-context-wrong-table",
            format!("the context map's entries for symbols 0 and {a} swapped: lanes decode with the wrong tables"),
            edit(&|s| s.swap(map, map + a)),
        ),
        (
            "r25-context-cut",
            "a planes-context chunk cut inside its context map".into(),
            edit(&|s| s.truncate(map + 100)),
        ),
        (
            "r25-context-lanes-tag",
            "a planes-context chunk relabelled planes-lanes (0x0009), which has no mode 3".into(),
            edit_dir(&file, |d| d.tensors[0].chunks[0].codec = CodecTag::PlanesLanes),
        ),
    ];
    for (path, description, bytes) in cases {
        bad(g, path, "R25", &description, bytes, Malformed);
    }
}

/// The base-context record's rules (§6.4.1), broken in the first base-context plane of a
/// `delta-sub-context` chunk; and mode 4 under the 1.2 delta lane tag.
fn base_contexts(g: &mut Gen) {
    let file = g.get(DELTA_SUB_CONTEXT).bytes.clone();
    let ti = dir(&file).tensors.iter().position(|t| t.name == "w.f32").expect("an f32 tensor");
    let c = dir(&file).tensors[ti].chunks[0].clone();
    let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    let n = c.element_count as usize;
    let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, 4, n).expect("valid");
    // The record before the first base-context record ends where that one's mode byte is.
    let first = records.iter().position(|r| matches!(r, PlaneRecord::BaseContexts(..))).expect("a base-context plane");
    let at = match first.checked_sub(1).map(|j| &records[j]) {
        None => 0,
        Some(PlaneRecord::Stored(at)) => at + n,
        Some(PlaneRecord::Lanes(_, layout) | PlaneRecord::BaseContexts(_, layout)) => layout.bytes.end,
        Some(_) => unreachable!("not a delta-sub-context record"),
    };
    assert_eq!(stored[at], 4, "a base-context record");
    let map = at + 1;
    let tables = usize::from(*stored[map..map + 256].iter().max().unwrap()) + 1;
    assert!(tables >= 4, "several tables");
    // The base contexts (f32 exponents) of the chunk, most frequent first.
    let base = g.get(CONTEXT_BASE).bytes.clone();
    let bc = dir(&base).tensors.iter().find(|t| t.name == "w.f32").expect("the base tensor").chunks[0].clone();
    let mut elements = vec![0u8; bc.decoded_length as usize];
    let base_stored = &base[bc.offset as usize..(bc.offset + bc.stored_length) as usize];
    tpde_codec::decode(bc.codec, ChunkContext::keyframe(DType::F32), &[], base_stored, &mut elements).expect("valid");
    let mut contexts = Vec::new();
    tpde_codec::planes::base_contexts(DType::F32, &elements, &mut contexts);
    let mut count = [0usize; 256];
    for &k in &contexts {
        count[usize::from(k)] += 1;
    }
    let mut by_count: Vec<usize> = (0..256).collect();
    by_count.sort_by_key(|&k| std::cmp::Reverse(count[k]));
    // Two frequent contexts whose tables differ: swapping their entries moves symbols to a
    // table that codes them otherwise (two tables alike would make the swap no change).
    let PlaneRecord::BaseContexts(model, _) = &records[first] else { unreachable!("found above") };
    let table = |k: usize| &model.tables()[usize::from(model.map()[k])];
    let a = by_count[0];
    let b = *by_count.iter().find(|&&k| count[k] > 0 && table(k) != table(a)).expect("two tables that differ");
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = stored.clone();
        f(&mut s);
        surgery::with_chunk(&file, ti, 0, &s).expect("surgery")
    };
    let cases: Vec<(&str, String, Vec<u8>)> = vec![
        (
            "r25-base-context-map-entry",
            format!("a base-context map entry of 16 (for exponent 0x{a:02X}): past the 16 tables a record may have"),
            edit(&|s| s[map + a] = 16),
        ),
        (
            "r25-base-context-wrong-table",
            format!("the base-context map's entries for exponents 0x{a:02X} and 0x{b:02X} swapped: lanes decode with the wrong tables"),
            edit(&|s| s.swap(map + a, map + b)),
        ),
        (
            "r25-base-context-cut",
            "a delta-sub-context chunk cut inside its base-context map".into(),
            edit(&|s| s.truncate(map + 100)),
        ),
        (
            "r25-base-context-lanes-tag",
            "a delta-sub-context chunk relabelled delta-sub-lanes (0x000B), which has no mode 4".into(),
            edit_dir(&file, |d| d.tensors[ti].chunks[0].codec = CodecTag::DeltaSubLanes),
        ),
    ];
    for (path, description, bytes) in cases {
        bad_delta(g, path, "R25", &description, bytes, CONTEXT_BASE, Malformed);
    }
}

/// Files that break one rule where an older file breaks two (spec §9's precedences), and the
/// points the 1.4 revision made explicit: short files (P1, P2) and `tpde.max_abs_error`'s type.
fn single_rule(g: &mut Gen) {
    let small = g.get(SMALL_RAW).bytes.clone();
    let mut crc = small.clone();
    crc[60] ^= 1;
    bad(
        g,
        "r03-header-crc-field",
        "R3",
        "a flipped bit in header_crc32 itself: only R3 is broken",
        crc,
        ChecksumMismatch,
    );
    let mut trailer = small.clone();
    let n = trailer.len();
    trailer[n - 12] ^= 1;
    bad(
        g,
        "r07-trailer-crc-field",
        "R7",
        "a flipped bit in trailer_crc32 itself: only R7 is broken",
        trailer,
        ChecksumMismatch,
    );
    bad(
        g,
        "r05-magic-prefix",
        "R5",
        "the first 5 bytes of the magic, nothing else (P1)",
        small[..5].to_vec(),
        Truncated,
    );
    let mut major = small[..10].to_vec();
    major[8] = 2;
    bad(
        g,
        "r02-major-2-in-10-bytes",
        "R2",
        "the magic and major version 2, 10 bytes in all: R2 needs only bytes 8-9 (P2)",
        major,
        UnsupportedVersion,
    );
    let lossy = g.get("valid/delta-lossy.tpde").bytes.clone();
    bad_delta(
        g,
        "r17-max-abs-error-type",
        "R17",
        "tpde.max_abs_error as a string (the spec says f64)",
        edit_dir(&lossy, |d| {
            let m = d.metadata.iter_mut().find(|m| m.key == "tpde.max_abs_error").expect("the bound");
            m.value = MetadataValue::String("0.001".into());
        }),
        DELTA_BASE,
        Malformed,
    );
    // 1.5's relative bound, likewise an f64.
    let relative = g.get("valid/delta-lossy-relative.tpde").bytes.clone();
    bad_delta(
        g,
        "r17-max-rel-error-type",
        "R17",
        "tpde.max_rel_error as a u64 (the spec says f64)",
        edit_dir(&relative, |d| {
            let m = d.metadata.iter_mut().find(|m| m.key == "tpde.max_rel_error").expect("the bound");
            m.value = MetadataValue::U64(1);
        }),
        "valid/delta-lossy-relative-base.tpde",
        Malformed,
    );
}

/// 1.6's predictions (§6.8, R30 at open; R29 for the base tensor a prediction reads): the
/// predicted delta with its params edited.
fn predicted(g: &mut Gen) {
    let file = g.get(PREDICTED).bytes.clone();
    // Rewrites the params of every predicted chunk of tensor `name` with `edit`.
    let with_params = |name: &'static str, edit: fn(&mut Prediction)| {
        edit_dir(&file, move |d| {
            let t = d.tensors.iter_mut().find(|t| t.name == name).expect("the tensor");
            for c in t.chunks.iter_mut().filter(|c| c.codec == CodecTag::DeltaPredicted) {
                let mut p = Prediction::parse(&c.params).expect("valid params");
                edit(&mut p);
                c.params = p.to_bytes();
            }
        })
    };
    fn first_name(p: &mut Prediction, to: &str) {
        match p {
            Prediction::AdamSecondMoment { exp_avg, .. }
            | Prediction::AdamParameter { exp_avg, .. }
            | Prediction::AdamSecondMomentReverse { exp_avg, .. }
            | Prediction::AdamParameterReverse { exp_avg, .. } => *exp_avg = to.into(),
        }
    }
    let cases: Vec<(&str, &str, &str, Vec<u8>)> = vec![
        (
            "r30-predicted-name-absent",
            "R30",
            "w's prediction reads m.absent, which the file lacks",
            with_params("w", |p| first_name(p, "m.absent")),
        ),
        (
            "r30-predicted-loop",
            "R30",
            "v's prediction reads w, whose prediction reads v: a loop",
            with_params("v", |p| first_name(p, "w")),
        ),
        ("r30-predicted-self", "R30", "v's prediction reads v itself", with_params("v", |p| first_name(p, "v"))),
        (
            "r30-predicted-predictor-5",
            "R30",
            "a prediction's predictor byte is 5 (1.9 defines 1 to 4)",
            edit_dir(&file, |d| {
                let c = d.tensors[0].chunks.iter_mut().find(|c| c.codec == CodecTag::DeltaPredicted).expect("one");
                c.params[0] = 5;
            }),
        ),
        (
            "r30-predicted-trailing-byte",
            "R30",
            "a byte after a prediction's last name",
            edit_dir(&file, |d| {
                let c = d.tensors[0].chunks.iter_mut().find(|c| c.codec == CodecTag::DeltaPredicted).expect("one");
                c.params.push(0);
            }),
        ),
    ];
    for (name, rule, description, bytes) in cases {
        bad_delta(g, name, rule, description, bytes, PREDICTED_BASE, Malformed);
    }
}

/// The 1.6 revision's files (issue 43), each catching a reader that passes the files before it
/// with a plausible bug; each breaks only R30 or R25, since the moments they read are keyframes
/// or the tensors they touch exist in the base with the same dtype.
fn predicted_edges(g: &mut Gen) {
    let sub = g.get(PREDICTED_SUBNORMAL).bytes.clone();
    let index = |file: &[u8], name: &str| dir(file).tensors.iter().position(|t| t.name == name).expect("the tensor");
    // Rewrites the params of tensor `name`'s predicted chunks with `edit`.
    let with_prediction = |file: &[u8], name: &str, edit: &dyn Fn(&mut Prediction)| {
        let ti = index(file, name);
        edit_dir(file, |d| {
            for c in d.tensors[ti].chunks.iter_mut().filter(|c| c.codec == CodecTag::DeltaPredicted) {
                let mut p = Prediction::parse(&c.params).expect("valid params");
                edit(&mut p);
                c.params = p.to_bytes();
            }
        })
    };
    let (sm, sv) = (index(&sub, "sm"), index(&sub, "sv"));
    let cases: Vec<(&str, &str, &str, Vec<u8>)> = vec![
        (
            "r30-predicted-shape",
            "R30",
            "delta-predicted-subnormal with its keyframe moment sm, which sv and sw read, reshaped to [16, 16]",
            edit_dir(&sub, |d| d.tensors[sm].shape = vec![16, 16]),
        ),
        (
            "r30-predicted-tensor-dtype",
            "R30",
            "delta-predicted-subnormal with a tensor sv.bits, i32, whose chunk is sv's predicted chunk (the base holds sv.bits, i32, with sv's bytes)",
            edit_dir(&sub, |d| {
                let t = TensorEntry { name: "sv.bits".into(), dtype: DType::I32, ..d.tensors[sv].clone() };
                d.tensors.push(t);
            }),
        ),
        (
            "r30-predicted-input-dtype",
            "R30",
            "delta-predicted-subnormal with its raw keyframe moment sm, which sv and sw read, declared i32",
            edit_dir(&sub, |d| d.tensors[sm].dtype = DType::I32),
        ),
        (
            "r30-predicted-second-name-absent",
            "R30",
            "delta-predicted-subnormal with sw's prediction (predictor 2) reading v from sv.absent, which the file lacks",
            with_prediction(&sub, "sw", &|p| {
                if let Prediction::AdamParameter { exp_avg_sq, .. } = p {
                    *exp_avg_sq = "sv.absent".into();
                }
            }),
        ),
    ];
    for (name, rule, description, bytes) in cases {
        bad_delta(g, name, rule, description, bytes, PREDICTED_EDGE_BASE, Malformed);
    }
    // The base lacks the tensor named; its own entry in the file is sm's raw keyframe chunk.
    let mut absent = edit_dir(&sub, |d| d.tensors.push(TensorEntry { name: "sm.new".into(), ..d.tensors[sm].clone() }));
    absent = with_prediction(&absent, "sv", &|p| {
        if let Prediction::AdamSecondMoment { exp_avg, .. } = p {
            *exp_avg = "sm.new".into();
        }
    });
    bad_delta(
        g,
        "r29-predicted-base-moment-absent",
        "R29",
        "delta-predicted-subnormal with sv's prediction reading sm.new, a raw keyframe of the file that the base lacks",
        absent,
        PREDICTED_EDGE_BASE,
        Malformed,
    );

    // The chain of 5: c0, a plain delta, made a predicted chunk reading c1, coded against
    // that prediction; a reader with no bound decodes it to c0's bytes.
    let chain = g.get(PREDICTED_CHAIN).clone();
    let base = g.get(PREDICTED_EDGE_BASE).clone();
    let data = |ts: &[crate::T], name: &str| ts.iter().find(|t| t.name == name).expect("the tensor").data.clone();
    let p = crate::valid::edge_moment("c1");
    let predicted = crate::valid::prediction_of(
        &p,
        &data(&base.tensors, "c0"),
        &data(&chain.tensors, "c1"),
        &data(&base.tensors, "c1"),
    );
    let mut stored = Vec::new();
    tpde_codec::Predicted::encode_against(
        DType::F32,
        &predicted,
        &data(&chain.tensors, "c0"),
        tpde_codec::planes::Records::FIRST,
        &mut stored,
    )
    .expect("encodes");
    let c0 = index(&chain.bytes, "c0");
    let mut five = surgery::with_chunk(&chain.bytes, c0, 0, &stored).expect("surgery");
    five = edit_dir(&five, |d| {
        let c = &mut d.tensors[c0].chunks[0];
        (c.codec, c.params) = (CodecTag::DeltaPredicted, p.to_bytes());
    });
    bad_delta(
        g,
        "r30-predicted-chain-5",
        "R30",
        "delta-predicted-chain with c0 predicted from c1: a chain of 5 predicted tensors (c0 to c4), its chunk coded against that prediction",
        five,
        PREDICTED_EDGE_BASE,
        Malformed,
    );
    // The same chain with its first link a reverse predictor (1.9): predictor 3 reads c1 of the
    // file as predictor 1 does, so the chain is as long.
    let p = Prediction::AdamSecondMomentReverse {
        one_minus_beta1: crate::valid::EDGE_MOMENT.0,
        beta2: crate::valid::EDGE_MOMENT.1,
        one_minus_beta2: crate::valid::EDGE_MOMENT.2,
        exp_avg: "c1".into(),
    };
    let predicted = crate::valid::prediction_of(
        &p,
        &data(&base.tensors, "c0"),
        &data(&chain.tensors, "c1"),
        &data(&base.tensors, "c1"),
    );
    let mut stored = Vec::new();
    tpde_codec::Predicted::encode_against(
        DType::F32,
        &predicted,
        &data(&chain.tensors, "c0"),
        tpde_codec::planes::Records::FIRST,
        &mut stored,
    )
    .expect("encodes");
    let mut five = surgery::with_chunk(&chain.bytes, c0, 0, &stored).expect("surgery");
    five = edit_dir(&five, |d| {
        let c = &mut d.tensors[c0].chunks[0];
        (c.codec, c.params) = (CodecTag::DeltaPredicted, p.to_bytes());
    });
    bad_delta(
        g,
        "r30-predicted-reverse-chain-5",
        "R30",
        "delta-predicted-chain with c0 predicted from c1 by predictor 3 (1.9): a chain of 5 predicted tensors (c0 to c4), its chunk coded against that prediction",
        five,
        PREDICTED_EDGE_BASE,
        Malformed,
    );

    // Plane modes a predicted chunk may not hold (§6.2), each a genuine record of x's residual
    // against its prediction, so that a reader that accepts the mode decodes x's bytes.
    let ctx = g.get(PREDICTED_CONTEXTS).clone();
    let x = data(&ctx.tensors, "x");
    let p = crate::valid::edge_moment("xm");
    let predicted = crate::valid::prediction_of(
        &p,
        &data(&base.tensors, "x"),
        &data(&ctx.tensors, "xm"),
        &data(&base.tensors, "xm"),
    );
    let residual = tpde_codec::Dense::forward(tpde_codec::DenseOp::Sub, DType::F32, &x, &predicted);
    let xi = index(&ctx.bytes, "x");
    let n = x.len() / 4;
    let mut serial = Vec::new();
    tpde_codec::planes::encode(&residual, 4, tpde_codec::PlaneForm::Serial, tpde_codec::Records::FIRST, &mut serial);
    // Mode 3 records by hand (the encoder finds them not worth it on these planes): the low
    // plane stored, the others coded by the symbol before, as §6.2.4 gives.
    let mut contexts = Vec::new();
    for k in 0..4 {
        let plane: Vec<u8> = residual.iter().skip(k).step_by(4).copied().collect();
        if k == 0 {
            contexts.push(0);
            contexts.extend_from_slice(&plane);
        } else {
            use tpde_codec::rans::context::{pair_counts, Contexts};
            let pairs = pair_counts(&plane, tpde_codec::rans::lane_count(n), false);
            let map = Contexts::group(&pairs).expect("symbols");
            contexts.push(3);
            Contexts::encode_neighbours(map, Some(&pairs), &plane, &mut contexts);
        }
    }
    for (name, stored, mode, tag, want) in [
        ("r25-predicted-serial-mode", serial, "1 (serial rANS)", CodecTag::DeltaSub, "Serial"),
        ("r25-predicted-context-mode", contexts, "3 (neighbour contexts)", CodecTag::PlanesContext, "Contexts"),
    ] {
        // The records are genuine: they parse under a tag that allows their mode.
        let (records, _) = tpde_codec::planes::parse(tag, &stored, 0, 4, n).expect("records");
        let kinds: Vec<String> = records.iter().map(|r| format!("{r:?}").chars().take(12).collect()).collect();
        assert!(kinds.iter().any(|k| k.starts_with(want)), "{name}: {kinds:?}");
        let description = format!(
            "delta-predicted-contexts with x's chunk recoded against its prediction with plane records of mode {mode}, which delta-predicted does not allow"
        );
        let bytes = surgery::with_chunk(&ctx.bytes, xi, 0, &stored).expect("surgery");
        bad_delta(g, name, "R25", &description, bytes, PREDICTED_EDGE_BASE, Malformed);
    }
}

/// `FILES` with its `tpde.files` value replaced.
fn with_files_value(g: &Gen, value: MetadataValue) -> Vec<u8> {
    edit_dir(&g.get(FILES).bytes, |d| {
        let m = d.metadata.iter_mut().find(|m| m.key == tpde_format::files::KEY_FILES).expect("a file table");
        m.value = value;
    })
}

/// R31 (§5.5): file tables that break one rule each, in frames written by hand.
fn files(g: &mut Gen) {
    use crate::valid::{checksummed_frame, long_path, raw_blocks, raw_frame, table_bytes};
    let framed = |table: &[u8]| MetadataValue::Bytes(raw_frame(table.len() as u32, table));
    let one = |path: &[u8]| {
        let t = table_bytes(1, &[(path, b"{}")]);
        MetadataValue::Bytes(raw_frame(t.len() as u32, &t))
    };
    let good = table_bytes(1, &[(b"config.json", b"{}")]);
    let cases: Vec<(&str, &str, MetadataValue, ErrorKind)> = vec![
        (
            "r31-files-not-a-frame",
            "the value is a zip header, not a Zstandard frame",
            MetadataValue::Bytes(b"PK\x03\x04rest".to_vec()),
            Malformed,
        ),
        (
            "r31-files-magic-only",
            "the value is the four bytes of the frame magic number, with no frame header descriptor",
            MetadataValue::Bytes(vec![0x28, 0xB5, 0x2F, 0xFD]),
            Malformed,
        ),
        (
            "r31-files-no-content-size",
            "a frame that does not declare its content size",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x00];
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-table-too-long",
            "a frame declaring 64 MiB + 1 bytes of content (checked before decompressing)",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0];
                f.extend(((64u64 << 20) + 1).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            LimitExceeded,
        ),
        (
            "r31-files-window-too-large",
            "a frame asking for a 1 GiB window for 19 bytes",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 20 << 3];
                f.extend((good.len() as u32).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            LimitExceeded,
        ),
        (
            "r31-files-needs-dictionary",
            "a frame that names a dictionary",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0xA1, 7];
                f.extend((good.len() as u32).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-skippable-frame",
            "a skippable frame (RFC 8878 §3.1.2) holding a valid frame: not a Zstandard frame",
            {
                let inner = raw_frame(good.len() as u32, &good);
                let mut f = vec![0x50, 0x2A, 0x4D, 0x18];
                f.extend((inner.len() as u32).to_le_bytes());
                f.extend(inner);
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-reserved-bit",
            "a frame header with its reserved bit (bit 3 of the descriptor) set",
            {
                let mut f = raw_frame(good.len() as u32, &good);
                f[4] |= 0x08;
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-content-checksum",
            "a frame whose content checksum does not match its content",
            {
                let mut f = checksummed_frame(&good);
                let last = f.len() - 1;
                f[last] ^= 0x01;
                assert!(zstd::bulk::decompress(&f, good.len()).is_err(), "libzstd checks the checksum");
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-content-size-wrong",
            "a frame whose content is one byte shorter than its header says",
            MetadataValue::Bytes(raw_frame(good.len() as u32 + 1, &good)),
            Malformed,
        ),
        (
            "r31-files-after-frame",
            "a byte after the frame",
            {
                let mut f = raw_frame(good.len() as u32, &good);
                f.push(0);
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-table-trailing-byte",
            "a byte after the last file of the table",
            framed(&[&good[..], &[0]].concat()),
            Malformed,
        ),
        (
            "r31-files-count-past-end",
            "a count of 2 and one file",
            framed(&table_bytes(2, &[(b"config.json", b"{}")])),
            Malformed,
        ),
        ("r31-files-count-over-limit", "a count of 4097 files", framed(&4097u32.to_le_bytes()), LimitExceeded),
        (
            "r31-files-length-past-end",
            "a file whose length runs past the table",
            {
                let mut t = table_bytes(1, &[(b"config.json", b"{}")]);
                t.truncate(t.len() - 1);
                framed(&t)
            },
            Malformed,
        ),
        ("r31-files-dot-dot", "the path ../config.json", one(b"../config.json"), Malformed),
        ("r31-files-absolute", "the path /etc/passwd", one(b"/etc/passwd"), Malformed),
        ("r31-files-backslash", "the path a\\b", one(b"a\\b"), Malformed),
        ("r31-files-drive", "the path C:config.json", one(b"C:config.json"), Malformed),
        ("r31-files-empty-component", "the path a//b", one(b"a//b"), Malformed),
        ("r31-files-dot", "the path ./config.json", one(b"./config.json"), Malformed),
        ("r31-files-control", "a path with a newline", one(b"config\n.json"), Malformed),
        ("r31-files-empty-path", "an empty path", one(b""), Malformed),
        ("r31-files-path-not-utf8", "a path that is not UTF-8", one(b"config\xff.json"), Malformed),
        ("r31-files-path-too-long", "a path of 1025 bytes", one(&[b'a'; 1025]), LimitExceeded),
        ("r31-files-component-too-long", "a path component of 256 bytes", one(&[b'a'; 256]), LimitExceeded),
        ("r31-files-weights", "a weight file, model.safetensors", one(b"model.safetensors"), Malformed),
        // Each alone catches a reader that checks the rule only in its commonest form.
        ("r31-files-trailing-slash", "the path config/ (an empty last component)", one(b"config/"), Malformed),
        ("r31-files-colon", "the path a:b.json (a colon that is not a drive prefix)", one(b"a:b.json"), Malformed),
        ("r31-files-del", "a path holding DEL (U+007F)", one(b"config\x7f.json"), Malformed),
        (
            "r31-files-c1-control",
            "a path holding NEL (U+0085, a C1 control)",
            one("config\u{85}.json".as_bytes()),
            Malformed,
        ),
        (
            "r31-files-path-too-long-in-components",
            "a path of 1025 bytes whose components are at most 255 (the path limit alone)",
            one(long_path(1025).as_bytes()),
            LimitExceeded,
        ),
        (
            "r31-files-file-and-grandfolder",
            "a file a and a file a/b/c: a is a folder two levels up",
            framed(&table_bytes(2, &[(b"a", b"{}"), (b"a/b/c", b"[]")])),
            Malformed,
        ),
        (
            "r31-files-window-mantissa",
            "a window descriptor of exponent 16 and mantissa 1: 64 MiB + 8 MiB (64 MiB without the mantissa)",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, (16 << 3) | 1];
                f.extend((good.len() as u32).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            LimitExceeded,
        ),
        (
            "r31-files-content-size-limit",
            "a frame (not single segment, 1 KiB window) declaring 64 MiB + 1 bytes: the content-size limit alone",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x00];
                f.extend(((64u64 << 20) + 1).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            LimitExceeded,
        ),
        // P9's orders where the categories differ: a limit before what else its value breaks.
        (
            "r31-files-path-too-long-not-utf8",
            "a path of 1025 bytes, components of at most 255, that is not UTF-8: the limit first (limit-exceeded)",
            one(&{
                let mut p = long_path(1025).into_bytes();
                p[0] = 0xFF;
                p
            }),
            LimitExceeded,
        ),
        (
            "r31-files-component-too-long-colon",
            "a component of 256 bytes holding a colon: the limit first (limit-exceeded)",
            one(&[&[b'a'; 255][..], b":"].concat()),
            LimitExceeded,
        ),
        (
            "r31-files-window-and-dictionary",
            "a frame asking for a 1 GiB window that also names a dictionary: the window first (limit-exceeded)",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x81, 20 << 3, 7];
                f.extend((good.len() as u32).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            LimitExceeded,
        ),
        (
            "r31-files-weights-index",
            "an index of weights, model.safetensors.index.json",
            one(b"model.safetensors.index.json"),
            Malformed,
        ),
        (
            "r31-files-weights-in-folder",
            "a weight file in a folder, sub/pytorch_model.bin",
            one(b"sub/pytorch_model.bin"),
            Malformed,
        ),
        (
            "r31-files-weights-case",
            "a weight file in capitals, MODEL.SafeTensors",
            one(b"MODEL.SafeTensors"),
            Malformed,
        ),
        // The weights rule one suffix, one form at a time (§5.5): each alone catches a reader
        // whose list lacks it.
        ("r31-files-weights-pt", "a weight file, model.pt", one(b"model.pt"), Malformed),
        ("r31-files-weights-pth", "a weight file, model.pth", one(b"model.pth"), Malformed),
        ("r31-files-weights-ckpt", "a weight file, last.ckpt", one(b"last.ckpt"), Malformed),
        ("r31-files-weights-h5", "a weight file, tf_model.h5", one(b"tf_model.h5"), Malformed),
        ("r31-files-weights-msgpack", "a weight file, flax_model.msgpack", one(b"flax_model.msgpack"), Malformed),
        ("r31-files-weights-gguf", "a weight file, model.gguf", one(b"model.gguf"), Malformed),
        ("r31-files-weights-onnx", "a weight file, model.onnx", one(b"model.onnx"), Malformed),
        ("r31-files-weights-bin", "a weight file at the top, pytorch_model.bin", one(b"pytorch_model.bin"), Malformed),
        (
            "r31-files-weights-bin-index",
            "an index of .bin weights, pytorch_model.bin.index.json",
            one(b"pytorch_model.bin.index.json"),
            Malformed,
        ),
        (
            "r31-files-weights-index-case",
            "an index whose .index.json is in capitals, model.safetensors.INDEX.Json",
            one(b"model.safetensors.INDEX.Json"),
            Malformed,
        ),
        ("r31-files-weights-suffix-only", "a component that is only a suffix, .bin", one(b".bin"), Malformed),
        (
            "r31-files-weights-suffix-only-index",
            "a component that is only a suffix and an index, .onnx.index.json",
            one(b".onnx.index.json"),
            Malformed,
        ),
        (
            "r31-files-colon-inside",
            "a colon where no drive prefix could be, config/a.b:c",
            one(b"config/a.b:c"),
            Malformed,
        ),
        (
            "r31-files-component-too-long-weights",
            "a last component of 256 bytes ending in .bin: the limit first (limit-exceeded)",
            one(&[&[b'a'; 252][..], b".bin"].concat()),
            LimitExceeded,
        ),
        // P9's frame header order where the categories differ: each check before the window's
        // limit (a reader that checks the window first says limit-exceeded).
        (
            "r31-files-reserved-bit-before-window",
            "a frame with its reserved bit set and a 1 GiB window: the reserved bit first (malformed)",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x88, 20 << 3];
                f.extend((good.len() as u32).to_le_bytes());
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-no-content-size-before-window",
            "a frame that does not declare its content size, with a 1 GiB window: the content size first (malformed)",
            {
                let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 20 << 3];
                raw_blocks(&mut f, &good);
                MetadataValue::Bytes(f)
            },
            Malformed,
        ),
        (
            "r31-files-cut-header-before-window",
            "a frame header cut after a 1 GiB window descriptor (its 4-byte content size missing): a whole header first (malformed)",
            MetadataValue::Bytes(vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 20 << 3]),
            Malformed,
        ),
        // P9's file table order: entries in order, repeats last.
        (
            "r31-files-bad-path-before-long-path",
            "a path a\\b, then a path of 1025 bytes: the first entry's rule first (malformed)",
            framed(&table_bytes(2, &[(b"a\\b", b"{}"), (long_path(1025).as_bytes(), b"[]")])),
            Malformed,
        ),
        (
            "r31-files-repeat-before-long-path",
            "config.json twice, then a path of 1025 bytes: repeats are judged last (limit-exceeded)",
            framed(&table_bytes(
                3,
                &[(b"config.json", b"{}"), (b"config.json", b"[]"), (long_path(1025).as_bytes(), b"[]")],
            )),
            LimitExceeded,
        ),
        (
            "r31-files-repeated",
            "config.json twice",
            framed(&table_bytes(2, &[(b"config.json", b"{}"), (b"config.json", b"[]")])),
            Malformed,
        ),
        (
            "r31-files-file-and-folder",
            "a file a and a file a/b",
            framed(&table_bytes(2, &[(b"a", b"{}"), (b"a/b", b"[]")])),
            Malformed,
        ),
    ];
    for (name, description, value, error) in cases {
        // The isolation rule for the paths of one-file tables (the others break a table rule).
        if let MetadataValue::Bytes(frame) = &value {
            if let Some(path) = one_path(frame) {
                let ordered: &[&str] = match name {
                    // P9: the path's limit before its component's (both limit-exceeded).
                    "r31-files-path-too-long" => &["path over 1024 bytes", "component over 255 bytes"],
                    "r31-files-path-too-long-not-utf8" => &["path over 1024 bytes", "not UTF-8"],
                    "r31-files-component-too-long-colon" => &["component over 255 bytes", "holds :"],
                    "r31-files-component-too-long-weights" => &["component over 255 bytes", "names weights"],
                    _ => &[],
                };
                crate::isolation::assert_isolated_path(name, &path, ordered);
            }
        }
        let bytes = with_files_value(g, value);
        bad(g, name, "R31", description, bytes, error);
    }
    // The weights rule (1.8) in a file declaring 1.7, the version of file tables: it holds
    // whatever version a file declares (§11).
    let weights = with_files_value(g, one(b"model.safetensors"));
    bad(
        g,
        "r31-files-weights-declared-1-7",
        "R31",
        "a weight file, model.safetensors, in a file declaring 1.7 (the weights rule is 1.8's, and holds whatever the version)",
        edit_header(&weights, |h| h.minor_version = 7),
        Malformed,
    );
    let as_string = with_files_value(g, MetadataValue::String("config.json".into()));
    bad(g, "r17-files-type", "R17", "tpde.files as a string (the spec says bytes)", as_string, Malformed);
}

/// The path of a raw-block frame (`raw_frame`) of a one-file table whose file is `{}`, if the
/// frame is one: the tables the path cases build.
fn one_path(frame: &[u8]) -> Option<Vec<u8>> {
    if frame.len() < 9 + 3 || frame[..5] != [0x28, 0xB5, 0x2F, 0xFD, 0xA0] {
        return None;
    }
    let mut content = Vec::new();
    let mut at = 9;
    while at + 3 <= frame.len() {
        let header = u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], 0]);
        let len = (header >> 3) as usize;
        content.extend_from_slice(frame.get(at + 3..at + 3 + len)?);
        at += 3 + len;
        if header & 1 == 1 {
            break;
        }
    }
    let count = u32::from_le_bytes(content.get(..4)?.try_into().ok()?);
    let path_len = u16::from_le_bytes(content.get(4..6)?.try_into().ok()?) as usize;
    let path = content.get(6..6 + path_len)?.to_vec();
    let rest = content.get(6 + path_len..)?;
    (count == 1 && rest == [2, 0, 0, 0, 0, 0, 0, 0, b'{', b'}']).then_some(path)
}

/// `codes` (value, bit count) written MSB-first (§6.1), zero-padded to a byte: the bytes and
/// how many bits of the last byte pad it.
fn msb_first(codes: &[(u64, u32)]) -> (Vec<u8>, u32) {
    let (mut out, mut acc, mut filled) = (Vec::new(), 0u8, 0u32);
    for &(value, bits) in codes {
        for i in (0..bits).rev() {
            acc = acc << 1 | ((value >> i) & 1) as u8;
            filled += 1;
            if filled == 8 {
                out.push(acc);
                (acc, filled) = (0, 0);
            }
        }
    }
    let pad = (8 - filled) % 8;
    if filled > 0 {
        out.push(acc << pad);
    }
    (out, pad)
}

/// §6.5.1's gaps: the first counts from position −1.
fn gaps(positions: &[u32]) -> Vec<u64> {
    let mut prev = -1i64;
    positions
        .iter()
        .map(|&p| {
            let g = (i64::from(p) - prev) as u64;
            prev = i64::from(p);
            g
        })
        .collect()
}

/// Golomb-Rice positions (§6.5.1) with any parameter `k`, 32 included, written here from the
/// text: the k byte, then the codes; and the padding bits of the last byte.
fn rice_by_hand(positions: &[u32], k: u32) -> (Vec<u8>, u32) {
    let codes: Vec<(u64, u32)> = gaps(positions)
        .into_iter()
        .flat_map(|g| {
            let q = (g >> k) as u32;
            [((1u64 << q) - 1) << 1, g & ((1u64 << k) - 1)].into_iter().zip([q + 1, k])
        })
        .collect();
    let (bits, pad) = msb_first(&codes);
    ([vec![k as u8], bits].concat(), pad)
}

/// Packed positions (§6.5.1) with every block's gaps in `width` bits, 33 included, written
/// here from the text; and the padding bits of the last block.
fn packed_by_hand(positions: &[u32], width: u32) -> (Vec<u8>, u32) {
    let blocks: Vec<&[u32]> = positions.chunks(tpde_codec::positions::PACKED_BLOCK).collect();
    let mut out: Vec<u8> =
        blocks.iter().flat_map(|b| [b[0].to_le_bytes().to_vec(), vec![width as u8]].concat()).collect();
    let mut pad = 0;
    for b in &blocks {
        let codes: Vec<(u64, u32)> = b.windows(2).map(|w| (u64::from(w[1] - w[0]), width)).collect();
        let (bits, p) = msb_first(&codes);
        out.extend(bits);
        pad = p;
    }
    (out, pad)
}

/// The first of `codings` (bytes, padding bits) whose last byte has padding, with its lowest
/// padding bit set to 1.
fn last_pad_bit_set(mut codings: impl Iterator<Item = (Vec<u8>, u32)>) -> Vec<u8> {
    let (mut bytes, _) = codings.find(|(_, pad)| *pad > 0).expect("a parameter that pads");
    *bytes.last_mut().expect("padding is in a byte") |= 1;
    bytes
}

/// Replaces the positions of the sparse record at `at` (`sp`, of a plane of `n`) with
/// `code` of the same positions, and its `positions_len`.
fn recode_positions(
    s: &mut Vec<u8>,
    at: usize,
    sp: &tpde_codec::planes::SparsePlane,
    n: usize,
    code: &dyn Fn(&[u32], u32) -> Vec<u8>,
) {
    let mut positions = Vec::new();
    let original = &s[sp.positions.clone()];
    sp.coder.decode(original, sp.count, n as u64, &mut positions).expect("valid positions");
    // The hand encoders give the reference's bytes for the parameter it chose.
    let parameter = match sp.coder {
        PositionCoder::Rice => {
            assert_eq!(rice_by_hand(&positions, u32::from(original[0])).0, original, "the hand Rice encoder");
            u32::from(original[0])
        }
        _ => {
            let width = u32::from(original[4]);
            if positions.len() <= tpde_codec::positions::PACKED_BLOCK {
                assert_eq!(packed_by_hand(&positions, width).0, original, "the hand packed encoder");
            }
            width
        }
    };
    let coded = code(&positions, parameter);
    s[at + 7..at + 11].copy_from_slice(&(coded.len() as u32).to_le_bytes());
    s.splice(sp.positions.clone(), coded);
}

/// An edit of a chunk's stored bytes, given where its sparse record starts, the record and n.
type SparseEdit = dyn Fn(&mut Vec<u8>, usize, &tpde_codec::planes::SparsePlane, usize);

/// R25 (§6.2.5): the sparse plane records of `SPARSE_PLANES`, each broken one way.
fn sparse_planes(g: &mut Gen) {
    let file = g.get(SPARSE_PLANES).bytes.clone();
    let d = dir(&file);
    // The sparse top plane of tensor `ti`: the chunk's stored bytes and where the record starts.
    let record = |ti: usize| {
        let c = d.tensors[ti].chunks[0].clone();
        let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
        let n = c.element_count as usize;
        let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, 4, n).expect("valid");
        let PlaneRecord::Sparse(s) = &records[3] else { unreachable!("the generator checked it") };
        let at = s.positions.start - 10 - 1; // mode, fill, count, coder, positions_len
        assert_eq!(stored[at], 5, "a sparse record");
        (stored, at, s.clone(), n)
    };
    let edit = |ti: usize, f: &SparseEdit| {
        let (mut stored, at, s, n) = record(ti);
        f(&mut stored, at, &s, n);
        surgery::with_chunk(&file, ti, 0, &stored).expect("surgery")
    };
    let (b, c) = (1, 2);
    let (_, _, sb, _) = record(b);
    assert!(matches!(*sb.values, PlaneRecord::Stored(_)), "b's listed bytes are stored");
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "r25-sparse-plane-count-over-n",
            "a sparse record that lists n + 1 positions",
            edit(b, &|s, at, _, n| s[at + 2..at + 6].copy_from_slice(&(n as u32 + 1).to_le_bytes())),
        ),
        (
            "r25-sparse-plane-coder-2",
            "a sparse record whose position coder is 2",
            edit(b, &|s, at, _, _| s[at + 6] = 2),
        ),
        (
            "r25-sparse-plane-value-is-fill",
            "a sparse record that lists a byte equal to its fill byte",
            edit(b, &|s, at, sp, _| {
                let PlaneRecord::Stored(v) = *sp.values else { unreachable!() };
                s[v] = s[at + 1];
            }),
        ),
        (
            "r25-sparse-plane-position-past-end",
            "a sparse record whose first packed block starts at position n",
            edit(c, &|s, _, sp, n| {
                s[sp.positions.start..sp.positions.start + 4].copy_from_slice(&(n as u32).to_le_bytes())
            }),
        ),
        // §6.5.1 inside a sparse record, each condition alone: positions coded by hand.
        (
            "r25-sparse-plane-rice-k-32",
            "a sparse record whose Golomb-Rice positions are coded with k = 32 (k is 0..=31), every code whole",
            edit(b, &|s, at, sp, n| recode_positions(s, at, sp, n, &|p, _| rice_by_hand(p, 32).0)),
        ),
        (
            "r25-sparse-plane-rice-padding",
            "a sparse record whose Golomb-Rice codes end with a padding bit of 1",
            edit(b, &|s, at, sp, n| {
                recode_positions(s, at, sp, n, &|p, k| last_pad_bit_set((k..32).map(|k| rice_by_hand(p, k))))
            }),
        ),
        (
            "r25-sparse-plane-packed-width-33",
            "a sparse record whose packed positions are coded in 33-bit gaps (a width is 0..=32), every block whole",
            edit(c, &|s, at, sp, n| recode_positions(s, at, sp, n, &|p, _| packed_by_hand(p, 33).0)),
        ),
        (
            "r25-sparse-plane-packed-padding",
            "a sparse record whose last packed block ends with a padding bit of 1",
            edit(c, &|s, at, sp, n| {
                recode_positions(s, at, sp, n, &|p, width| last_pad_bit_set((width..33).map(|w| packed_by_hand(p, w))))
            }),
        ),
        (
            "r25-sparse-plane-byte-after-positions",
            "a sparse record with a zero byte after its Golomb-Rice codes, counted in positions_len",
            edit(b, &|s, at, sp, _| {
                s.insert(sp.positions.end, 0);
                let len = (sp.positions.len() + 1) as u32;
                s[at + 7..at + 11].copy_from_slice(&len.to_le_bytes());
            }),
        ),
        (
            "r25-sparse-plane-values-mode",
            "a sparse record whose listed bytes are a context record (mode 3)",
            edit(c, &|s, _, sp, _| s[sp.positions.end] = 3),
        ),
        (
            "r25-sparse-plane-cut",
            "a delta-xor-context chunk cut inside its sparse record's header",
            edit(b, &|s, at, _, _| s.truncate(at + 6)),
        ),
        (
            "r25-sparse-plane-lanes-tag",
            "a chunk with a sparse record relabelled delta-xor-lanes (0x000A), which has no mode 5",
            edit_dir(&file, |d| d.tensors[0].chunks[0].codec = CodecTag::DeltaXorLanes),
        ),
        (
            "r25-sparse-plane-context-tag",
            "a chunk with a sparse record relabelled planes-context (0x000D), which allows modes 0, 2 and 3 but not 5",
            edit_dir(&file, |d| d.tensors[0].chunks[0].codec = CodecTag::PlanesContext),
        ),
    ];
    for (path, description, bytes) in cases {
        bad_delta(g, path, "R25", description, bytes, SPARSE_PLANES_BASE, Malformed);
    }
}

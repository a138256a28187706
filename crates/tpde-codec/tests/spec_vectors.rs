//! The plane-record byte formats against the spec, independently of the writer: the records
//! here are built by a small encoder written from the text of spec §6.2.1–§6.2.4 and §6.4.1
//! (not from tpde-codec's encoder), and tpde-codec must decode them to the symbols they were
//! built from. The corpus is the writer's own output; these are not.
//!
//! Every record is the one plane of a `u8` chunk, so the chunk's stored bytes are the record and
//! its decoded bytes are the plane (an integer dtype: no rotation, spec §6.2).

use tpde_codec::{decode, ChunkContext};
use tpde_format::{CodecTag, DType};

const SCALE: u32 = 4096;
const LOW: u32 = 1 << 23;

/// A frequency table (§6.2.1): the bitmap of present symbols, then their frequencies.
#[derive(Clone)]
struct Table {
    freq: [u32; 256],
}

impl Table {
    fn new(pairs: &[(u8, u32)]) -> Table {
        let mut freq = [0; 256];
        for &(s, f) in pairs {
            freq[s as usize] = f;
        }
        assert_eq!(freq.iter().sum::<u32>(), SCALE);
        Table { freq }
    }

    fn start(&self, s: u8) -> u32 {
        self.freq[..s as usize].iter().sum()
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; 32];
        for s in 0..256 {
            if self.freq[s] > 0 {
                out[s / 8] |= 1 << (s % 8);
            }
        }
        for s in 0..256 {
            if self.freq[s] > 0 {
                out.extend((self.freq[s] as u16).to_le_bytes());
            }
        }
        out
    }
}

/// The inverse of §6.2.2's decoding step for one state: encodes `symbols` (each with its
/// table), last first, from the state 2^23. Returns the state to store and the renormalisation
/// bytes in the order the decoder reads them.
fn encode_state(symbols: &[(u8, &Table)]) -> (u32, Vec<u8>) {
    let mut x = LOW;
    let mut out = Vec::new();
    for &(s, t) in symbols.iter().rev() {
        let f = t.freq[s as usize];
        // Renormalise so that the step below lands in [2^23, 2^31): the decoder's loop reads
        // these bytes back right after it decodes s.
        while x >= (LOW >> 12 << 8) * f {
            out.push(x as u8);
            x >>= 8;
        }
        x = (x / f) * SCALE + x % f + t.start(s);
    }
    out.reverse();
    (x, out)
}

/// A mode 0x01 record (§6.2, §6.2.2): four interleaved states, symbol i on state i mod 4,
/// one renormalisation stream in decoding order.
fn serial_record(symbols: &[u8], t: &Table) -> Vec<u8> {
    // The four states share one byte stream: encode all symbols in reverse order, each on its
    // state, collecting bytes in reverse reading order.
    let mut x = [LOW; 4];
    let mut out = Vec::new();
    for (i, &s) in symbols.iter().enumerate().rev() {
        let k = i % 4;
        let f = t.freq[s as usize];
        while x[k] >= (LOW >> 12 << 8) * f {
            out.push(x[k] as u8);
            x[k] >>= 8;
        }
        x[k] = (x[k] / f) * SCALE + x[k] % f + t.start(s);
    }
    out.reverse();
    let mut rec = vec![0x01];
    rec.extend(t.bytes());
    rec.extend((16 + out.len() as u32).to_le_bytes());
    for s in x {
        rec.extend(s.to_le_bytes());
    }
    rec.extend(out);
    rec
}

/// Lanes (§6.2.3): word q (symbols 4q..4q+3) belongs to lane q mod L; each lane decodes its
/// words' symbols in order with one state and its own bytes. `table(lane_symbols, j)` is the
/// table of a lane's j-th symbol.
fn lanes(symbols: &[u8], l: usize, table: &dyn Fn(usize, &[u8], usize) -> Table) -> Vec<u8> {
    let words: Vec<&[u8]> = symbols.chunks(4).collect();
    let mut states = Vec::new();
    let mut ends = Vec::new();
    let mut bytes = Vec::new();
    for lane in 0..l {
        // The lane's symbols with their element indices.
        let mine: Vec<(usize, u8)> = (lane..words.len())
            .step_by(l)
            .flat_map(|q| words[q].iter().enumerate().map(move |(j, &s)| (4 * q + j, s)))
            .collect();
        let seq: Vec<u8> = mine.iter().map(|&(_, s)| s).collect();
        let tables: Vec<Table> = mine.iter().enumerate().map(|(j, &(i, _))| table(i, &seq, j)).collect();
        let (x, out) = encode_state(&seq.iter().zip(&tables).map(|(&s, t)| (s, t)).collect::<Vec<_>>());
        states.push(x);
        bytes.extend(out);
        ends.push(bytes.len() as u32);
    }
    let mut rec = (l as u32).to_le_bytes().to_vec();
    for s in states {
        rec.extend(s.to_le_bytes());
    }
    for e in ends {
        rec.extend(e.to_le_bytes());
    }
    rec.extend(bytes);
    rec
}

/// A 256-entry context map and its tables (§6.2.4, §6.4.1).
fn map_and_tables(map: &[u8; 256], tables: &[Table]) -> Vec<u8> {
    assert_eq!(tables.len(), 1 + *map.iter().max().unwrap() as usize);
    let mut out = map.to_vec();
    for t in tables {
        out.extend(t.bytes());
    }
    out
}

fn decoded(tag: CodecTag, stored: &[u8], n: usize, base: Option<&[u8]>) -> Vec<u8> {
    let mut out = vec![0u8; n];
    decode(tag, ChunkContext { dtype: DType::U8, base }, &[], stored, &mut out)
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    out
}

/// Symbols from a small skewed source, reproducible.
fn source(n: usize, alphabet: &[u8]) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Skewed: the first symbols of the alphabet most often.
            let r = (x % 1000) as usize;
            alphabet[(r * r / 1000 * alphabet.len() / 1000).min(alphabet.len() - 1)]
        })
        .collect()
}

fn skewed_table(alphabet: &[u8]) -> Table {
    // Frequencies falling with the rank; the first takes the rest so they sum to 4096.
    let mut pairs: Vec<(u8, u32)> = alphabet.iter().enumerate().map(|(r, &s)| (s, 64 >> r.min(6))).collect();
    let rest: u32 = pairs[1..].iter().map(|p| p.1).sum();
    pairs[0].1 = SCALE - rest;
    Table::new(&pairs)
}

#[test]
fn a_serial_rans_plane_decodes_as_section_6_2_2_says() {
    // A hand-checkable one first: two symbols of frequency 2048 cost exactly one bit each.
    let half = Table::new(&[(7, 2048), (200, 2048)]);
    let symbols = [7, 200, 200, 7, 7, 7, 200, 7, 200];
    let rec = serial_record(&symbols, &half);
    assert_eq!(&rec[..2], &[0x01, 0x80], "mode, then the bitmap (symbol 7: bit 7 of byte 0)");
    assert_eq!(decoded(CodecTag::Planes, &rec, symbols.len(), None), symbols);
    // Then 10 000 skewed symbols.
    let alphabet = [3, 1, 250, 9, 0, 77, 128, 200];
    let symbols = source(10_000, &alphabet);
    let rec = serial_record(&symbols, &skewed_table(&alphabet));
    assert!(rec.len() < symbols.len(), "{} bytes", rec.len());
    assert_eq!(decoded(CodecTag::Planes, &rec, symbols.len(), None), symbols);
}

#[test]
fn a_lane_record_decodes_as_section_6_2_3_says() {
    let alphabet = [5, 6, 7, 8, 40];
    let t = skewed_table(&alphabet);
    // 3 lanes over 23 symbols: 6 words, the last of 3 symbols; lane k owns words k, k+3.
    for (n, l) in [(23, 3), (4 * 4096 + 1, 5), (1, 1)] {
        let symbols = source(n, &alphabet);
        let mut rec = vec![0x02];
        rec.extend(t.bytes());
        rec.extend(lanes(&symbols, l, &|_, _, _| t.clone()));
        assert_eq!(decoded(CodecTag::PlanesLanes, &rec, n, None), symbols, "{n} symbols, {l} lanes");
    }
}

#[test]
fn a_context_record_decodes_as_section_6_2_4_says() {
    // Two tables: after an even symbol table 0 (favours small symbols), after an odd one
    // table 1 (favours large ones). A lane's first symbol takes table map[0].
    let t0 = Table::new(&[(0, 3000), (1, 500), (2, 500), (3, 96)]);
    let t1 = Table::new(&[(0, 96), (1, 500), (2, 500), (3, 3000)]);
    let mut map = [0u8; 256];
    for a in (1..256).step_by(2) {
        map[a] = 1;
    }
    let tables = [t0, t1];
    let symbols = source(9 * 4 + 2, &[0, 3, 1, 2]);
    for l in [1usize, 2, 4] {
        let mut rec = vec![0x03];
        rec.extend(map_and_tables(&map, &tables));
        rec.extend(lanes(&symbols, l, &|_, seq, j| {
            let prev = if j == 0 { 0 } else { seq[j - 1] };
            tables[map[prev as usize] as usize].clone()
        }));
        assert_eq!(decoded(CodecTag::PlanesContext, &rec, symbols.len(), None), symbols, "{l} lanes");
    }
}

#[test]
fn a_base_context_record_decodes_as_section_6_4_1_says() {
    // delta-xor-context on u8: d = c XOR b (an integer dtype: no rotation), coded in one mode
    // 0x04 plane whose symbol i takes table map[k_i], k_i = b_i (the base byte itself).
    let n = 4 * 37 + 1;
    let base: Vec<u8> = (0..n).map(|i| if i % 3 == 0 { 0x10 } else { 0x90 }).collect();
    let cur: Vec<u8> = base.iter().zip(source(n, &[0, 0, 0, 1, 2, 4])).map(|(b, d)| b ^ d).collect();
    let d: Vec<u8> = cur.iter().zip(&base).map(|(c, b)| c ^ b).collect();
    let quiet = Table::new(&[(0, 4000), (1, 32), (2, 32), (4, 32)]);
    let busy = Table::new(&[(0, 1024), (1, 1024), (2, 1024), (4, 1024)]);
    let mut map = [0u8; 256];
    map[0x90] = 1;
    let tables = [quiet, busy];
    for l in [1usize, 3] {
        let mut rec = vec![0x04];
        rec.extend(map_and_tables(&map, &tables));
        rec.extend(lanes(&d, l, &|i, _, _| tables[map[base[i] as usize] as usize].clone()));
        assert_eq!(decoded(CodecTag::DeltaXorContext, &rec, n, Some(&base)), cur, "{l} lanes");
    }
}

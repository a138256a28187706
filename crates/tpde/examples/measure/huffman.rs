//! A Huffman prototype for issue 55's choice of coder, measured against rANS blocks in
//! `examples/block_records`: canonical codes of at most 11 bits (so the decode table, 2^11
//! entries, fits a GPU's workgroup memory), symbol i in stream i mod 8 (eight interleaved
//! streams, as huff0's X4 and PivCo-Huffman interleave theirs), bits packed LSB first. Only as
//! far as a size and a one-core decode speed need: no stored table format, no checks.

/// Longest code.
const MAX: u32 = 11;
/// Interleaved streams.
pub const STREAMS: usize = 8;

pub struct Huffman {
    /// Code length per symbol (0: absent).
    lens: [u32; 256],
    /// Each symbol's code, bit-reversed for LSB-first packing.
    codes: [u32; 256],
    /// 2^MAX entries: symbol | length << 8.
    table: Vec<u16>,
}

impl Huffman {
    pub fn new(hist: &[u64; 256]) -> Huffman {
        let lens = lengths(hist);
        // Canonical codes: by length, then symbol.
        let mut order: Vec<usize> = (0..256).filter(|&s| lens[s] > 0).collect();
        order.sort_by_key(|&s| (lens[s], s));
        let (mut codes, mut code, mut prev) = ([0u32; 256], 0u32, 0u32);
        for &s in &order {
            code <<= lens[s] - prev;
            prev = lens[s];
            codes[s] = code.reverse_bits() >> (32 - lens[s]);
            code += 1;
        }
        let mut table = vec![0u16; 1 << MAX];
        for &s in &order {
            for k in 0..1u32 << (MAX - lens[s]) {
                table[(codes[s] | k << lens[s]) as usize] = s as u16 | (lens[s] as u16) << 8;
            }
        }
        Huffman { lens, codes, table }
    }

    /// The eight streams of `symbols`, each padded with 8 zero bytes for the decoder's reads.
    pub fn encode(&self, symbols: &[u8]) -> Vec<Vec<u8>> {
        (0..STREAMS)
            .map(|k| {
                let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0u32);
                for &s in symbols.iter().skip(k).step_by(STREAMS) {
                    acc |= u64::from(self.codes[usize::from(s)]) << bits;
                    bits += self.lens[usize::from(s)];
                    while bits >= 8 {
                        out.push(acc as u8);
                        acc >>= 8;
                        bits -= 8;
                    }
                }
                out.push(acc as u8);
                out.extend_from_slice(&[0; 8]);
                out
            })
            .collect()
    }

    /// Decodes `out.len()` symbols from `streams`: eight independent bit positions, one
    /// unaligned 8-byte read and one table lookup a symbol.
    pub fn decode(&self, streams: &[Vec<u8>], out: &mut [u8]) {
        let mut pos = [0usize; STREAMS];
        let read = |s: &[u8], bit: usize| -> usize {
            let b: [u8; 8] = s[bit >> 3..(bit >> 3) + 8].try_into().expect("8 bytes");
            (u64::from_le_bytes(b) >> (bit & 7)) as usize & ((1 << MAX) - 1)
        };
        let whole = out.len() / STREAMS * STREAMS;
        for group in out[..whole].chunks_exact_mut(STREAMS) {
            for k in 0..STREAMS {
                let e = self.table[read(&streams[k], pos[k])];
                group[k] = e as u8;
                pos[k] += usize::from(e >> 8);
            }
        }
        for (k, o) in out[whole..].iter_mut().enumerate() {
            let e = self.table[read(&streams[k], pos[k])];
            *o = e as u8;
            pos[k] += usize::from(e >> 8);
        }
    }
}

/// Huffman code lengths of `hist`, limited to [`MAX`] bits: the textbook merge of the two
/// rarest, then lengths over MAX clamped and the Kraft sum repaired by lengthening the rarest
/// symbols that can still grow.
fn lengths(hist: &[u64; 256]) -> [u32; 256] {
    let mut lens = [0u32; 256];
    let present: Vec<usize> = (0..256).filter(|&s| hist[s] > 0).collect();
    if present.len() == 1 {
        lens[present[0]] = 1;
        return lens;
    }
    let mut nodes: Vec<(u64, Vec<usize>)> = present.iter().map(|&s| (hist[s], vec![s])).collect();
    while nodes.len() > 1 {
        nodes.sort_by_key(|n| std::cmp::Reverse(n.0));
        let (a, b) = (nodes.pop().expect("two"), nodes.pop().expect("two"));
        for &s in a.1.iter().chain(&b.1) {
            lens[s] += 1;
        }
        nodes.push((a.0 + b.0, [a.1, b.1].concat()));
    }
    for l in lens.iter_mut().filter(|l| **l > MAX) {
        *l = MAX;
    }
    let mut kraft: u64 = present.iter().map(|&s| 1u64 << (MAX - lens[s])).sum();
    while kraft > 1 << MAX {
        let s = *present.iter().filter(|&&s| lens[s] < MAX).min_by_key(|&&s| hist[s]).expect("room");
        kraft -= 1 << (MAX - lens[s] - 1);
        lens[s] += 1;
    }
    lens
}

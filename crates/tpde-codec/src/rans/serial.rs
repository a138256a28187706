//! The serial stream (spec §6.2.2): four interleaved states over one byte stream, decoded on
//! one core.

use super::*;

/// Encodes `symbols` with `table` (which must give every symbol in them a frequency) and
/// appends `u32 len` and the stream.
pub fn encode(table: &Table, symbols: &[u8], out: &mut Vec<u8>) {
    let enc = SymbolEncoder::new(table);
    let mut spill = Spill::new(symbols.len());
    let x = if branchless(&table.freq) {
        enc.serial::<true>(symbols, &mut spill)
    } else {
        enc.serial::<false>(symbols, &mut spill)
    };
    let bytes = spill.bytes();
    out.extend_from_slice(&((4 * LANES + bytes.len()) as u32).to_le_bytes());
    for xi in x {
        out.extend_from_slice(&xi.to_le_bytes());
    }
    out.extend_from_slice(bytes);
}

/// Decodes `out.len()` symbols from the stream at the front of `input` (starting with its
/// `u32 len`), returning the bytes after it. The stream must be consumed exactly and end in
/// the encoder's initial state.
pub fn decode<'a>(table: &Table, input: &'a [u8], out: &mut [u8]) -> Result<&'a [u8], String> {
    let len = input.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    let len = len.ok_or("rANS stream length is cut short")?;
    let stream = input.get(4..4 + len).ok_or_else(|| format!("rANS stream of {len} bytes runs past the chunk"))?;
    if len < 4 * LANES {
        return Err(format!("rANS stream of {len} bytes is shorter than its states"));
    }
    // slot -> (symbol, freq, start), one u32 lookup per symbol.
    let slots = table.slots();
    let mut x = [0u32; LANES];
    for (lane, xi) in x.iter_mut().enumerate() {
        *xi = u32::from_le_bytes(stream[4 * lane..4 * lane + 4].try_into().expect("4 bytes"));
    }
    let bytes = &stream[4 * LANES..];
    let mut pos = 0usize;
    // Fast path, four symbols (one per state) per step while at least 8 renormalisation bytes
    // are left (at most two per symbol). The checked loop below finishes the stream and finds
    // every error.
    let mut quads = out.chunks_exact_mut(LANES);
    let mut done = 0;
    let fast = branchless(&table.freq);
    for q in quads.by_ref().take_while(|_| fast) {
        if pos + 2 * LANES > bytes.len() {
            break;
        }
        for (o, xi) in q.iter_mut().zip(x.iter_mut()) {
            let (s, y) = pop(&slots, *xi);
            *o = s;
            *xi = refill_two(y, bytes, &mut pos);
        }
        done += LANES;
    }
    let corrupt = || "rANS stream ends before its symbols do".to_string();
    for (i, o) in out.iter_mut().enumerate().skip(done) {
        let (s, y) = pop(&slots, x[i % LANES]);
        *o = s;
        x[i % LANES] = refill(y, bytes, &mut pos).ok_or_else(corrupt)?;
    }
    if pos != bytes.len() || x.iter().any(|&xi| xi != L) {
        return Err("rANS stream does not end where its symbols do".into());
    }
    Ok(&input[4 + len..])
}

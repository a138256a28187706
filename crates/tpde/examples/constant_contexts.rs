//! What leaving a delta's *constant contexts* out of a mode 7 record buys (issue 68, item 3:
//! near-empty planes in time proportional to what changed): the measurement that chose spec
//! 1.11's unchanged contexts (§6.4.2, `rans::unchanged`). A dense delta's plane of a
//! base-context record is coded per base context; in a real fine-tune's bf16 weights most
//! contexts hold nothing but zero bytes in a chunk (the weights too large for the step to move
//! their low byte). This example measures, per 4 MiB chunk of `delta-sub`'s planes (all of
//! them), the mode 7 record with every element coded against a prototype of the record that
//! leaves those elements out: the rest coded in mode 7's blocks with tables of the rest alone.
//! Bytes, and decode time on one core (best of 15 runs, the record in cache). The prototype's
//! time is its decode plus two passes a decoder adds, leaving out the constant elements'
//! contexts and expanding the decoded symbols, each done three ways: BMI2's `pext`/`pdep`, byte
//! shuffles from a table (AVX2), AVX-512 VBMI2's byte compress and expand.
//!
//!     cargo run --release -p tpde --example constant_contexts -- NEW.safetensors BASE.safetensors

mod measure;

use measure::{best, open_pair, CHUNK};
use tpde::codec::planes::base_contexts;
use tpde::codec::rans::{context, BlockLayout, BlockLoop, Contexts, CONTEXT_BLOCK_SYMBOLS};
use tpde::codec::{Dense, DenseOp};

/// Marks an element of a constant context in the prototype's table indices.
const SKIP: u8 = 0xFF;

/// Bytes and seconds (AVX2, AVX-512) of one record kind over every plane.
#[derive(Default)]
struct Kind {
    bytes: u64,
    s: [f64; 2],
}

impl Kind {
    fn add(&mut self, bytes: usize, s: [f64; 2]) {
        self.bytes += bytes as u64;
        self.s[0] += s[0];
        self.s[1] += s[1];
    }
}

/// A base-context block record of `symbols` in `contexts`: its bytes, and the best time of
/// decoding it into `out` on AVX2 and on AVX-512.
fn mode7(symbols: &[u8], contexts: &[u8], out: &mut [u8]) -> (Vec<u8>, [f64; 2]) {
    let pairs = context::given_pair_counts(symbols, contexts, false);
    let map = Contexts::group(&pairs).expect("symbols");
    let model = Contexts::new(map, &pairs);
    let tables: Vec<u8> = contexts.iter().map(|&k| map[usize::from(k)]).collect();
    let mut rec = Vec::new();
    model.encode_given_blocks(symbols, &tables, &mut rec);
    let (m, rest) = Contexts::read(&rec).expect("a record");
    let l =
        BlockLayout::read_sized(&rec, rec.len() - rest.len(), symbols.len(), CONTEXT_BLOCK_SYMBOLS).expect("blocks");
    let s = [BlockLoop::Avx2, BlockLoop::Avx512]
        .map(|lp| best(|| m.decode_given_blocks_with(&rec, &l, &tables, out, lp).expect("decodes")));
    (rec, s)
}

/// Eight bytes of `x` as a byte mask: 0xFF where the byte is not [`SKIP`].
fn kept(x: u64) -> u64 {
    let z = !x;
    let nonzero = (((z & 0x7F7F_7F7F_7F7F_7F7F) + 0x7F7F_7F7F_7F7F_7F7F) | z) & 0x8080_8080_8080_8080;
    (nonzero >> 7) * 0xFF
}

/// The bytes of `marked` that are not [`SKIP`], in order, into `coded`: eight at a time by
/// BMI2's `pext`, as a decoder would gather the table indices of the coded elements.
///
/// # Safety
/// The CPU must have BMI2.
#[target_feature(enable = "bmi2")]
#[allow(unsafe_code)]
unsafe fn leave_out(marked: &[u8], coded: &mut Vec<u8>) {
    use std::arch::x86_64::_pext_u64;
    coded.resize(marked.len() + 8, 0);
    let mut at = 0;
    for c in marked.chunks_exact(8) {
        let x = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        let m = kept(x);
        coded[at..at + 8].copy_from_slice(&_pext_u64(x, m).to_le_bytes());
        at += (m.count_ones() / 8) as usize;
    }
    for &k in marked.chunks_exact(8).remainder() {
        coded[at] = k;
        at += usize::from(k != SKIP);
    }
    coded.truncate(at);
}

/// The decoded symbols `dec` of the coded elements placed at their elements, zero at the
/// others: eight at a time by BMI2's `pdep`.
///
/// # Safety
/// The CPU must have BMI2.
#[target_feature(enable = "bmi2")]
#[allow(unsafe_code)]
unsafe fn expand(marked: &[u8], dec: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::_pdep_u64;
    let mut padded = [0u8; 8];
    let mut at = 0;
    for (o, c) in out.chunks_exact_mut(8).zip(marked.chunks_exact(8)) {
        let m = kept(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        let src = if at + 8 <= dec.len() {
            &dec[at..at + 8]
        } else {
            let left = dec.len() - at;
            padded[..left].copy_from_slice(&dec[at..]);
            &padded[..]
        };
        let x = u64::from_le_bytes(src.try_into().expect("8 bytes"));
        o.copy_from_slice(&_pdep_u64(x, m).to_le_bytes());
        at += (m.count_ones() / 8) as usize;
    }
    let whole = out.len() / 8 * 8;
    for (o, &k) in out[whole..].iter_mut().zip(&marked[whole..]) {
        *o = if k != SKIP { dec[at] } else { 0 };
        at += usize::from(k != SKIP);
    }
}

/// [`leave_out`] 64 bytes at a time by AVX-512 VBMI2's byte compress.
///
/// # Safety
/// The CPU must have AVX-512 BW and VBMI2.
#[target_feature(enable = "avx512bw,avx512vbmi2")]
#[allow(unsafe_code)]
unsafe fn leave_out_vbmi2(marked: &[u8], coded: &mut Vec<u8>) {
    use std::arch::x86_64::*;
    coded.resize(marked.len() + 64, 0);
    let skip = _mm512_set1_epi8(SKIP as i8);
    let mut at = 0;
    for c in marked.chunks_exact(64) {
        let x = _mm512_loadu_si512(c.as_ptr().cast());
        let k = _mm512_cmpneq_epi8_mask(x, skip);
        // SAFETY: `coded` has 64 bytes past every `at` reached here.
        _mm512_storeu_si512(coded.as_mut_ptr().add(at).cast(), _mm512_maskz_compress_epi8(k, x));
        at += k.count_ones() as usize;
    }
    for &k in marked.chunks_exact(64).remainder() {
        coded[at] = k;
        at += usize::from(k != SKIP);
    }
    coded.truncate(at);
}

/// [`expand`] 64 bytes at a time by AVX-512 VBMI2's byte expand; `dec` has 64 bytes of
/// padding past its symbols.
///
/// # Safety
/// The CPU must have AVX-512 BW and VBMI2.
#[target_feature(enable = "avx512bw,avx512vbmi2")]
#[allow(unsafe_code)]
unsafe fn expand_vbmi2(marked: &[u8], dec: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let skip = _mm512_set1_epi8(SKIP as i8);
    let mut at = 0;
    for (o, c) in out.chunks_exact_mut(64).zip(marked.chunks_exact(64)) {
        let k = _mm512_cmpneq_epi8_mask(_mm512_loadu_si512(c.as_ptr().cast()), skip);
        assert!(at + 64 <= dec.len());
        let v = _mm512_loadu_si512(dec.as_ptr().add(at).cast());
        _mm512_storeu_si512(o.as_mut_ptr().cast(), _mm512_maskz_expand_epi8(k, v));
        at += k.count_ones() as usize;
    }
    let whole = out.len() / 64 * 64;
    for (o, &k) in out[whole..].iter_mut().zip(&marked[whole..]) {
        *o = if k != SKIP { dec[at] } else { 0 };
        at += usize::from(k != SKIP);
    }
}

/// For each mask of 8 kept bytes: the byte shuffle that packs the kept ones to the front
/// (`compress`), and the one that spreads packed bytes to the kept places, zero elsewhere.
fn shuffles() -> (Vec<[u8; 16]>, Vec<[u8; 16]>) {
    let (mut compress, mut expand) = (vec![[0x80u8; 16]; 256], vec![[0x80u8; 16]; 256]);
    for m in 0..256usize {
        let mut r = 0;
        for (i, e) in expand[m].iter_mut().take(8).enumerate() {
            if m >> i & 1 == 1 {
                compress[m][r] = i as u8;
                *e = r as u8;
                r += 1;
            }
        }
    }
    (compress, expand)
}

/// [`leave_out`] eight bytes at a time by an SSSE3 byte shuffle from a table (AVX2 machines
/// have no byte compress).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn leave_out_avx2(marked: &[u8], coded: &mut Vec<u8>, table: &[[u8; 16]]) {
    use std::arch::x86_64::*;
    coded.resize(marked.len() + 16, 0);
    let skip = _mm_set1_epi8(SKIP as i8);
    let mut at = 0;
    for c in marked.chunks_exact(8) {
        let x = _mm_loadl_epi64(c.as_ptr().cast());
        let m = (!_mm_movemask_epi8(_mm_cmpeq_epi8(x, skip)) & 0xFF) as usize;
        let packed = _mm_shuffle_epi8(x, _mm_loadu_si128(table[m].as_ptr().cast()));
        // SAFETY: `coded` has 16 bytes past every `at` reached here.
        _mm_storel_epi64(coded.as_mut_ptr().add(at).cast(), packed);
        at += m.count_ones() as usize;
    }
    for &k in marked.chunks_exact(8).remainder() {
        coded[at] = k;
        at += usize::from(k != SKIP);
    }
    coded.truncate(at);
}

/// [`expand`] eight bytes at a time by a byte shuffle from a table; `dec` has 64 bytes of
/// padding past its symbols.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn expand_avx2(marked: &[u8], dec: &[u8], out: &mut [u8], table: &[[u8; 16]]) {
    use std::arch::x86_64::*;
    let skip = _mm_set1_epi8(SKIP as i8);
    let mut at = 0;
    for (o, c) in out.chunks_exact_mut(8).zip(marked.chunks_exact(8)) {
        let m = (!_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadl_epi64(c.as_ptr().cast()), skip)) & 0xFF) as usize;
        assert!(at + 8 <= dec.len());
        let v = _mm_loadl_epi64(dec.as_ptr().add(at).cast());
        _mm_storel_epi64(o.as_mut_ptr().cast(), _mm_shuffle_epi8(v, _mm_loadu_si128(table[m].as_ptr().cast())));
        at += m.count_ones() as usize;
    }
    let whole = out.len() / 8 * 8;
    for (o, &k) in out[whole..].iter_mut().zip(&marked[whole..]) {
        *o = if k != SKIP { dec[at] } else { 0 };
        at += usize::from(k != SKIP);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !std::arch::is_x86_feature_detected!("bmi2") || !std::arch::is_x86_feature_detected!("avx2") {
        return Err("the prototype's leaving out and expanding need BMI2 and AVX2".into());
    }
    let vbmi2 = std::arch::is_x86_feature_detected!("avx512vbmi2");
    let (new, base) = open_pair("constant_contexts")?;
    let (compress, spread) = shuffles();
    // Mode 7 today; the prototype's decode of the elements left in; its passes, each way.
    let (mut today, mut left_in, mut symbols, mut skipped) = (Kind::default(), Kind::default(), 0u64, 0u64);
    let mut passes = [0.0f64; 3];
    let (mut contexts, mut marked, mut coded, mut out) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (_, dtype, new, base) in measure::common_floats(&new, &base) {
        let w = dtype.size() as usize;
        for (chunk, b) in new.chunks(CHUNK).zip(base.chunks(CHUNK)) {
            let d = Dense::forward(DenseOp::Sub, dtype, chunk, b);
            base_contexts(dtype, b, &mut contexts);
            let n = contexts.len();
            for j in 0..w {
                let plane: Vec<u8> = d.chunks_exact(w).map(|e| e[j]).collect();
                symbols += n as u64;
                out.resize(n, 0);
                let (rec, s) = mode7(&plane, &contexts, &mut out);
                assert_eq!(out, plane);
                today.add(rec.len(), s);

                // Contexts whose elements are all zero in this plane are left out. The decoder
                // would start from each element's context, SKIP for a constant one, as it
                // starts from the table indices today.
                let mut busy = [false; 256];
                for (&k, &p) in contexts.iter().zip(&plane) {
                    busy[usize::from(k)] |= p != 0;
                }
                marked.clear();
                marked.extend(contexts.iter().map(|&k| if busy[usize::from(k)] { k } else { SKIP }));
                let kept: Vec<usize> = (0..n).filter(|&e| marked[e] != SKIP).collect();
                skipped += (n - kept.len()) as u64;
                if kept.is_empty() {
                    left_in.add(256, [0.0; 2]);
                    continue;
                }
                let kept_symbols: Vec<u8> = kept.iter().map(|&e| plane[e]).collect();
                let kept_contexts: Vec<u8> = kept.iter().map(|&e| contexts[e]).collect();
                // The symbols left in, 64 bytes of padding past them for the vector expands.
                let mut decoded = vec![0u8; kept.len() + 64];
                let (rec, s) = mode7(&kept_symbols, &kept_contexts, &mut decoded[..kept.len()]);
                // The record would also say which contexts are constant: a bit each.
                left_in.add(rec.len() + 32, s);
                let mut expanded = vec![0u8; n];
                let mut timed = |i: usize, way: &mut dyn FnMut(&mut Vec<u8>, &mut [u8])| {
                    passes[i] += best(|| way(&mut coded, &mut expanded));
                    assert_eq!(expanded, plane);
                    assert_eq!(coded, kept_contexts);
                };
                // SAFETY: the CPU has BMI2 and AVX2 (checked above), and AVX-512 VBMI2 where
                // its passes run.
                #[allow(unsafe_code)]
                unsafe {
                    timed(0, &mut |c, e| {
                        leave_out(&marked, c);
                        expand(&marked, &decoded[..kept.len()], e)
                    });
                    timed(1, &mut |c, e| {
                        leave_out_avx2(&marked, c, &compress);
                        expand_avx2(&marked, &decoded, e, &spread)
                    });
                    if vbmi2 {
                        timed(2, &mut |c, e| {
                            leave_out_vbmi2(&marked, c);
                            expand_vbmi2(&marked, &decoded, e)
                        });
                    }
                }
            }
        }
    }
    let ns = |s: f64| format!("{:.3}", s * 1e9 / symbols as f64);
    println!(
        "delta-sub planes: {symbols} symbols, {:.3} of them in contexts constant in their chunk's plane",
        skipped as f64 / symbols as f64
    );
    println!(
        "leaving out and expanding alone, ns a symbol: {} by BMI2's pext/pdep, {} by byte shuffles (AVX2), {} by \
         AVX-512 VBMI2's compress/expand",
        ns(passes[0]),
        ns(passes[1]),
        if vbmi2 { ns(passes[2]) } else { "–".into() }
    );
    println!("| record | bytes | ns a symbol: AVX2 block loop | AVX-512 block loop |\n|---|---:|---:|---:|");
    println!("| mode 7 today | {} | {} | {} |", today.bytes, ns(today.s[0]), ns(today.s[1]));
    let with = |name: &str, p: f64, avx2: bool| {
        let avx512 = if vbmi2 || !avx2 { ns(left_in.s[1] + p) } else { "–".into() };
        let avx2 = if avx2 { ns(left_in.s[0] + p) } else { "–".into() };
        println!("| constant contexts left out, {name} | {} | {avx2} | {avx512} |", left_in.bytes);
    };
    with("passes by pext/pdep", passes[0], true);
    with("passes by byte shuffles", passes[1], true);
    if vbmi2 {
        with("passes by VBMI2", passes[2], false);
    }
    Ok(())
}

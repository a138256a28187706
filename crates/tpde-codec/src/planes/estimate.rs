//! How many bytes a plane's records will take, estimated from histograms (counted in full, or
//! from a sample of a large chunk): what the writer chooses records by.

use std::ops::Range;

use super::PlaneForm;
use crate::rans::{self, Table};

/// Chunks of at least this many elements are estimated from a sample (see
/// [`sampled_histograms`]).
pub(super) const SAMPLE_FROM: usize = 1 << 16;
/// The sample: one block of this many elements in every [`SAMPLE_STRIDE`].
const SAMPLE_BLOCK: usize = 1024;
const SAMPLE_STRIDE: usize = 8;

/// The plane histograms of `n` elements of `w` bytes, for choosing a form: `elements(range)`
/// gives the (transformed) elements of a byte range. Counted from every eighth block of 1024
/// elements when there are at least 65 536, which ranks the forms as the full count does on
/// checkpoint data at an eighth of the cost, and then scaled to `n`, so that the tables' cost
/// weighs as it will; from all of them below.
pub fn sampled_histograms<E: AsRef<[u8]>>(n: usize, w: usize, elements: impl Fn(Range<usize>) -> E) -> Vec<[u64; 256]> {
    if n < SAMPLE_FROM {
        return histograms(elements(0..n * w).as_ref(), w);
    }
    let mut counts = [[0u32; 256]; rans::GROUP];
    let mut sampled = 0u64;
    for start in (0..n).step_by(SAMPLE_BLOCK * SAMPLE_STRIDE) {
        let end = (start + SAMPLE_BLOCK).min(n);
        rans::count(elements(start * w..end * w).as_ref(), &mut counts);
        sampled += (end - start) as u64;
    }
    let scale = n as f64 / sampled as f64;
    fold(&counts, w).iter().map(|h| h.map(|c| (c as f64 * scale).round() as u64)).collect()
}

/// The histogram of every plane of elements of `w` bytes, counted in place.
pub fn histograms(elements: &[u8], w: usize) -> Vec<[u64; 256]> {
    let mut counts = [[0u32; 256]; rans::GROUP];
    rans::count(elements, &mut counts);
    fold(&counts, w)
}

/// Each plane's histogram from [`rans::count`]'s tables: table k counts plane k mod w.
fn fold(counts: &[[u32; 256]; rans::GROUP], w: usize) -> Vec<[u64; 256]> {
    (0..w).map(|j| std::array::from_fn(|s| counts[j..].iter().step_by(w).map(|t| u64::from(t[s])).sum())).collect()
}

/// Estimated stored bytes of planes with these histograms (entropy plus tables).
pub fn estimate(hists: &[[u64; 256]]) -> f64 {
    hists
        .iter()
        .map(|h| {
            let n: u64 = h.iter().sum();
            if n == 0 {
                return 1.0;
            }
            let bits: f64 = h
                .iter()
                .filter(|&&c| c > 0)
                .map(|&c| {
                    let p = c as f64 / n as f64;
                    -(c as f64) * p.log2()
                })
                .sum();
            let rans = bits / 8.0 + 32.0 + 2.0 * h.iter().filter(|&&c| c > 0).count() as f64 + 20.0;
            1.0 + rans.min(n as f64)
        })
        .sum()
}

/// A sampled plane estimated at this share of its length or more is stored without a full
/// count: well above the 0.98 at which a counted plane is, so that sampling decides only what
/// a full count would have.
pub(super) const NEAR_RANDOM: f64 = 0.995;

/// The bytes of a rANS record of `n` symbols with histogram `hist` in `form`, coded with `table`.
pub(super) fn coded_bytes(table: &Table, hist: &[u64; 256], n: usize, form: PlaneForm) -> f64 {
    let lanes = match form {
        PlaneForm::Serial => 0.0,
        _ => 8.0 * rans::lane_count(n) as f64,
    };
    table.encoded_len() as f64 + table.cost_bytes(hist) + lanes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plane_histograms_count_each_plane() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * i % 251) as u8 ^ (i % 3) as u8).collect();
        for w in [1, 2, 4, 8] {
            for len in [0, w, 15 * w, 16 * w, 17 * w, bytes.len() / w * w] {
                let elements = &bytes[..len];
                let mut expected = vec![[0u64; 256]; w];
                for (i, &b) in elements.iter().enumerate() {
                    expected[i % w][usize::from(b)] += 1;
                }
                assert_eq!(histograms(elements, w), expected, "w {w} len {len}");
            }
        }
    }
}

//! Opt-in lossy deltas (spec §6.6): a float element x whose base element b is within the
//! bound, |x − b| ≤ τ + ρ·|x|, takes the base's value, so the delta records no change there.
//! τ is absolute (`tpde.max_abs_error`), ρ relative to the element (`tpde.max_rel_error`), so
//! one ρ suits tensors whose scales differ by orders of magnitude (weights, layer norms, Adam's
//! moments). Applied against the base as it decodes (closed loop), the error against the
//! original never exceeds the bound, however long the chain: each file's elements are within it
//! of that checkpoint's own original values.
//!
//! Integer tensors, non-finite values and changes over the bound are kept exactly.

use tpde_format::DType;

/// How far a lossy delta's float elements may be from the original: |decoded − x| ≤ abs + rel·|x|
/// (the form of numpy's `isclose`). The default bounds nothing away: zero and zero.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bound {
    /// τ, `tpde.max_abs_error`.
    pub abs: f64,
    /// ρ, `tpde.max_rel_error`.
    pub rel: f64,
}

impl Bound {
    /// Whether `decoded` may stand for the original `x`.
    pub fn allows(&self, x: f64, decoded: f64) -> bool {
        (x - decoded).abs() <= self.abs + self.rel * x.abs()
    }
}

/// Replaces every float element of `data` whose base element is within `bound` of it by the
/// base's element. Returns `data` unchanged for integer dtypes.
pub fn snap_to_base(dtype: DType, data: &[u8], base: &[u8], bound: Bound) -> Vec<u8> {
    let mut out = data.to_vec();
    if !dtype.is_float() || data.len() != base.len() {
        return out;
    }
    let w = dtype.size() as usize;
    for (c, b) in out.chunks_exact_mut(w).zip(base.chunks_exact(w)) {
        if let (Some(x), Some(y)) = (element_value(dtype, c), element_value(dtype, b)) {
            if x.is_finite() && y.is_finite() && bound.allows(x, y) {
                c.copy_from_slice(b);
            }
        }
    }
    out
}

/// The value of one float element (little-endian bytes) as an f64, exactly; `None` for
/// integer dtypes.
pub fn element_value(dtype: DType, b: &[u8]) -> Option<f64> {
    Some(match dtype {
        DType::F64 => f64::from_le_bytes(b.try_into().ok()?),
        DType::F32 => f64::from(f32::from_le_bytes(b.try_into().ok()?)),
        DType::F16 => f64::from(half::f16::from_le_bytes(b.try_into().ok()?)),
        DType::BF16 => f64::from(half::bf16::from_le_bytes(b.try_into().ok()?)),
        // e5m2 is the top byte of an f16.
        DType::F8E5M2 => f64::from(half::f16::from_bits(u16::from(b[0]) << 8)),
        DType::F8E4M3 => f8_e4m3(b[0]),
        _ => return None,
    })
}

/// OCP float8 e4m3 ("fn"): bias 7, no infinities, S.1111.111 is NaN.
fn f8_e4m3(x: u8) -> f64 {
    let sign = if x & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((x >> 3) & 0xF);
    let man = f64::from(x & 7);
    if exp == 15 && x & 7 == 7 {
        return f64::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snaps_small_changes_only() {
        let base: Vec<u8> = [1.0f32, 2.0, 3.0, f32::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        let cur: Vec<u8> = [1.0005f32, 2.5, 3.0, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let abs = Bound { abs: 1e-3, rel: 0.0 };
        let out = snap_to_base(DType::F32, &cur, &base, abs);
        let v: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(v, [1.0, 2.5, 3.0, 0.0]);
        assert_eq!(snap_to_base(DType::I32, &cur, &base, Bound { abs: 1e9, rel: 1.0 }), cur);
    }

    #[test]
    fn a_relative_bound_scales_with_the_element() {
        // The same relative change of 1e-4 at three scales, and one of 1e-2.
        let base: Vec<u8> = [1.0f32, 1e-8, 1e4, 1.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let cur: Vec<u8> = [1.0001f32, 1.0001e-8, 1.0001e4, 1.01].iter().flat_map(|x| x.to_le_bytes()).collect();
        let rel = Bound { abs: 0.0, rel: 1e-3 };
        let v: Vec<f32> = snap_to_base(DType::F32, &cur, &base, rel)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v, [1.0, 1e-8, 1e4, 1.01]);
        // An absolute τ that keeps the change at 1 drops every change of the tiny element and
        // none of the large one's.
        let abs = Bound { abs: 1e-5, rel: 0.0 };
        assert!(abs.allows(1.0000001e-8, 5e-8) && !abs.allows(1.0001e4, 1e4));
        assert!(Bound { abs: 1e-3, rel: 1e-3 }.allows(1e4, 1e4 + 10.0));
    }

    #[test]
    fn f8_values() {
        assert_eq!(f8_e4m3(0x38), 1.0);
        assert_eq!(f8_e4m3(0x7E), 448.0);
        assert!(f8_e4m3(0x7F).is_nan());
        assert_eq!(element_value(DType::F8E5M2, &[0x3C]), Some(1.0));
    }
}

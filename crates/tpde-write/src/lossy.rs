//! Opt-in lossy deltas (spec §6.6): a float element whose change from the base is at most τ
//! takes the base's value, so the delta records no change there. Applied against the base as
//! it decodes (closed loop), the error against the original never exceeds τ, however long the
//! chain: each file's elements are within τ of that checkpoint's own original values.
//!
//! Integer tensors, non-finite values and changes above τ are kept exactly.

use tpde_format::DType;

/// Replaces every float element of `data` within `tau` of `base` by the base's element. Returns
/// `data` unchanged for integer dtypes.
pub fn snap_to_base(dtype: DType, data: &[u8], base: &[u8], tau: f64) -> Vec<u8> {
    let mut out = data.to_vec();
    if !dtype.is_float() || data.len() != base.len() {
        return out;
    }
    let w = dtype.size() as usize;
    for (c, b) in out.chunks_exact_mut(w).zip(base.chunks_exact(w)) {
        if let (Some(x), Some(y)) = (element_value(dtype, c), element_value(dtype, b)) {
            if x.is_finite() && y.is_finite() && (x - y).abs() <= tau {
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
        let out = snap_to_base(DType::F32, &cur, &base, 1e-3);
        let v: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(v, [1.0, 2.5, 3.0, 0.0]);
        assert_eq!(snap_to_base(DType::I32, &cur, &base, 1e9), cur);
    }

    #[test]
    fn f8_values() {
        assert_eq!(f8_e4m3(0x38), 1.0);
        assert_eq!(f8_e4m3(0x7E), 448.0);
        assert!(f8_e4m3(0x7F).is_nan());
        assert_eq!(element_value(DType::F8E5M2, &[0x3C]), Some(1.0));
    }
}

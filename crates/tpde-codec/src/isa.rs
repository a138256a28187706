//! Which vector loops the codec may use: what the CPU has, capped by the environment variable
//! `TPDE_ISA` (`scalar`, `avx2` or `avx512`, read once), so that one machine runs and measures
//! every path: the tests each loop, the benchmarks an AVX2 row beside an AVX-512 one (many users'
//! CPUs have no AVX-512). Unset (or any other value): no cap. Every loop gives the same bytes.

use std::sync::OnceLock;

/// The instruction sets the loops are written for, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust: the reference loops.
    Scalar,
    /// AVX2.
    Avx2,
    /// AVX-512 (F, BW, and VL or VBMI where a loop needs them).
    Avx512,
}

/// The cap `TPDE_ISA` sets.
pub fn cap() -> Isa {
    static CAP: OnceLock<Isa> = OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("TPDE_ISA").as_deref().map(str::trim) {
        Ok("scalar") => Isa::Scalar,
        Ok("avx2") => Isa::Avx2,
        _ => Isa::Avx512,
    })
}

/// Whether the AVX2 loops may run: the CPU has AVX2 and the cap allows it.
pub fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return cap() >= Isa::Avx2 && is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// Whether the AVX-512 loops may run: the CPU has AVX-512 F and BW (and `vl` / `vbmi` where a
/// loop asks for them) and the cap allows it.
pub fn avx512(vl: bool, vbmi: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    return cap() >= Isa::Avx512
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && (!vl || is_x86_feature_detected!("avx512vl"))
        && (!vbmi || is_x86_feature_detected!("avx512vbmi"));
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = (vl, vbmi);
        false
    };
}

/// Whether the AVX-512 loops that compress and expand bytes may run: [`avx512`]'s, and the CPU
/// has VBMI2.
pub fn avx512_vbmi2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512(false, false) && is_x86_feature_detected!("avx512vbmi2");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

//! The lane form's vector loops (x86-64): every `unsafe` of the rANS coder is here, behind safe
//! functions that check the CPU's features. They produce exactly what the scalar loops do (the
//! tests compare them).

pub(in crate::rans) mod avx2;
pub(in crate::rans) mod avx512;

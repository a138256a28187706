//! The lane and block forms' vector loops (x86-64): every `unsafe` of the rANS coder is here, behind safe
//! functions that check the CPU's features. They produce exactly what the scalar loops do (the
//! tests compare them).

pub(in crate::rans) mod avx2;
pub(in crate::rans) mod avx512;
pub(in crate::rans) mod blocks;

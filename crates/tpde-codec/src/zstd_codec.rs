//! `zstd` (tag 0x0001): one or more Zstandard frames (RFC 8878) whose concatenated content is
//! the chunk's logical bytes; no parameters. The level is an encoder setting only.

use std::cell::RefCell;

use tpde_format::CodecTag;

use crate::{no_params, ChunkCodec, ChunkContext, CodecError};

/// The level `tpde pack --codec zstd` uses unless told otherwise (zstd's own default).
pub const DEFAULT_LEVEL: i32 = 3;

/// The most a Zstandard stream can expand: an RLE block is a 3-byte block header plus one
/// byte, and produces at most 128 KiB (RFC 8878 §3.1.1.2).
pub const MAX_EXPANSION: u64 = (128 << 10) / 4;

// One compression and one decompression context per thread, reused across chunks: creating a
// context per chunk cost a measurable share of encode time.
thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The `zstd` codec.
#[derive(Clone, Copy, Debug)]
pub struct Zstd {
    /// Compression level for encoding.
    pub level: i32,
}

impl ChunkCodec for Zstd {
    fn tag(&self) -> CodecTag {
        CodecTag::Zstd
    }

    fn encode(&self, _: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        let err = |e: std::io::Error| CodecError::Encode { codec: CodecTag::Zstd, detail: e.to_string() };
        let start = out.len();
        out.resize(start + zstd::zstd_safe::compress_bound(input.len()), 0);
        let n = COMPRESSOR.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.as_ref().map(|(level, _)| *level) != Some(self.level) {
                *slot = Some((self.level, zstd::bulk::Compressor::new(self.level)?));
            }
            let (_, cctx) = slot.as_mut().expect("just set");
            cctx.compress_to_buffer(input, &mut out[start..])
        });
        out.truncate(start + n.map_err(err)?);
        Ok(Vec::new())
    }

    fn check_lengths(&self, stored: u64, decoded: u64) -> Result<(), CodecError> {
        if decoded <= stored.saturating_mul(MAX_EXPANSION) {
            Ok(())
        } else {
            Err(CodecError::Corrupt {
                codec: CodecTag::Zstd,
                detail: format!("{stored} stored bytes cannot decode to {decoded} bytes (at most {MAX_EXPANSION}x)"),
            })
        }
    }

    fn decode(&self, _: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        no_params(CodecTag::Zstd, params)?;
        // The output buffer is exactly the declared length: a frame that would produce more
        // fails inside zstd rather than growing anything.
        let n = DECOMPRESSOR
            .with(|slot| {
                let mut slot = slot.borrow_mut();
                if slot.is_none() {
                    *slot = Some(zstd::bulk::Decompressor::new()?);
                }
                slot.as_mut().expect("just set").decompress_to_buffer(stored, out)
            })
            .map_err(|e| CodecError::Corrupt { codec: CodecTag::Zstd, detail: e.to_string() })?;
        if n != out.len() {
            return Err(CodecError::LengthMismatch {
                codec: CodecTag::Zstd,
                found: n as u64,
                expected: out.len() as u64,
            });
        }
        Ok(())
    }
}

//! `raw` (tag 0x0000): the stored bytes are the logical bytes; no parameters.

use tpde_format::CodecTag;

use crate::{no_params, ChunkCodec, ChunkContext, CodecError};

/// The `raw` codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl ChunkCodec for Raw {
    fn tag(&self) -> CodecTag {
        CodecTag::Raw
    }

    fn encode(&self, _: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        out.extend_from_slice(input);
        Ok(Vec::new())
    }

    fn check_lengths(&self, stored: u64, decoded: u64) -> Result<(), CodecError> {
        if stored == decoded {
            Ok(())
        } else {
            Err(CodecError::LengthMismatch { codec: CodecTag::Raw, found: stored, expected: decoded })
        }
    }

    fn decode(&self, _: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        no_params(CodecTag::Raw, params)?;
        if stored.len() != out.len() {
            return Err(CodecError::LengthMismatch {
                codec: CodecTag::Raw,
                found: stored.len() as u64,
                expected: out.len() as u64,
            });
        }
        out.copy_from_slice(stored);
        Ok(())
    }
}

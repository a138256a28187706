//! Decodes submitted to the device and not yet waited for: a tensor's, or a group's
//! (`Gpu::submit_group`), with the error codes its kernels report.

use tpde_codec::CodecError;
use tpde_format::TensorEntry;
use tpde_read::{chunk_location, ReadError};

use crate::error::GpuError;
use crate::plan::KERNEL_ERRORS;
use crate::tensor::DeviceTensor;

/// One submitted batch: its chunks (numbered across the pending tensors, in order) and where
/// the kernels' error codes come back.
pub(crate) struct Submitted {
    pub(crate) chunks: Vec<usize>,
    pub(crate) errors: wgpu::Buffer,
    pub(crate) index: wgpu::SubmissionIndex,
}

/// Tensors whose decode is submitted to the device; [`Pending::finish`] waits for them (the
/// waiting lives with the device, in `device.rs`).
pub struct Pending {
    entries: Vec<TensorEntry>,
    tensors: Vec<DeviceTensor>,
    batches: Vec<Submitted>,
    /// The submission after the batches (a group's copies into each tensor's buffer).
    last: Option<wgpu::SubmissionIndex>,
}

impl Pending {
    pub(crate) fn new(
        entries: Vec<TensorEntry>,
        tensors: Vec<DeviceTensor>,
        batches: Vec<Submitted>,
        last: Option<wgpu::SubmissionIndex>,
    ) -> Pending {
        Pending { entries, tensors, batches, last }
    }

    /// The tensors' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|t| t.name.as_str())
    }

    /// The submission to wait for: the group's copies, or the last batch; none if nothing ran.
    pub(crate) fn last_index(&self) -> Option<wgpu::SubmissionIndex> {
        self.last.clone().or_else(|| self.batches.last().map(|b| b.index.clone()))
    }

    /// Asks for the batches' error codes, before the wait.
    pub(crate) fn map_errors(&self) {
        for b in &self.batches {
            b.errors.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        }
    }

    /// After the wait: the tensors, or the reader's error for the first chunk (in file order)
    /// that a kernel found malformed.
    pub(crate) fn checked(self) -> Result<Vec<DeviceTensor>, GpuError> {
        let mut first: Option<(usize, u32)> = None;
        for b in &self.batches {
            let view = b.errors.slice(..).get_mapped_range().map_err(|e| GpuError::Device(e.to_string()))?;
            let codes: &[u32] = bytemuck::cast_slice(&view);
            for (&chunk, &code) in b.chunks.iter().zip(codes) {
                if code != 0 && first.is_none_or(|(c, _)| chunk < c) {
                    first = Some((chunk, code));
                }
            }
        }
        let Some((mut i, code)) = first else { return Ok(self.tensors) };
        // Chunk i of them all: tensor by tensor.
        let mut entries = self.entries.iter();
        let t = loop {
            let t = entries.next().ok_or_else(|| GpuError::Device(format!("a kernel reported chunk {i}")))?;
            if i < t.chunks.len() {
                break t;
            }
            i -= t.chunks.len();
        };
        let c = &t.chunks[i];
        let detail = KERNEL_ERRORS.get(code as usize - 1).copied().unwrap_or("unknown kernel error").to_string();
        let source = CodecError::Corrupt { codec: c.codec, detail };
        Err(ReadError::Codec { location: chunk_location(t, i, c), source }.into())
    }
}

//! The host path: tensor buffers, uploads through buffers mapped at creation and filled by
//! every core, and reading tensors back.

use rayon::prelude::*;
use tpde_format::{DType, TensorEntry};
use tpde_read::check_digest;

use crate::device::Gpu;
use crate::error::GpuError;
use crate::tensor::DeviceTensor;

impl Gpu {
    pub(crate) fn tensor_buffer(&self, name: &str, bytes: u64) -> Result<wgpu::Buffer, GpuError> {
        let size = bytes.next_multiple_of(4).max(4);
        if size > self.max_buffer {
            return Err(GpuError::TooLarge {
                name: name.into(),
                detail: format!("{bytes} bytes, over the device's {}-byte buffer limit", self.max_buffer),
            });
        }
        self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
    }

    /// Uploads a tensor's logical bytes as they are, through the decoder's host path (a buffer
    /// mapped at creation, filled by every core).
    pub fn upload(&self, name: &str, dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<DeviceTensor, GpuError> {
        if bytes.len() as u64 > self.max_buffer {
            return Err(GpuError::TooLarge {
                name: name.into(),
                detail: format!("{} bytes, over the device's {}-byte buffer limit", bytes.len(), self.max_buffer),
            });
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let buffer = self.scoped(|| self.filled(name, bytes, usage))??;
        self.count_upload(bytes.len());
        Ok(DeviceTensor { name: name.into(), dtype, shape: shape.to_vec(), byte_length: bytes.len() as u64, buffer })
    }

    /// A buffer holding `bytes` (zero-padded to a multiple of 4): mapped at creation and filled
    /// by every core, a piece each (`create_buffer_init` and `write_buffer` copy on the calling
    /// thread alone, which bounded the host path of a whole decode).
    pub(crate) fn filled(
        &self,
        label: &str,
        bytes: &[u8],
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, GpuError> {
        const PIECE: usize = 4 << 20; // a multiple of wgpu's MAP_ALIGNMENT
        let size = (bytes.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT).max(wgpu::COPY_BUFFER_ALIGNMENT);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: true,
        });
        let views: Vec<_> = (0..size)
            .step_by(PIECE)
            .map(|at| buffer.slice(at..(at + PIECE as u64).min(size)).get_mapped_range_mut())
            .collect::<Result<_, _>>()
            // Disjoint ranges of a buffer mapped at creation: only a buffer the device could not
            // allocate has none.
            .map_err(|e| GpuError::OutOfMemory(format!("{label}: {size} bytes: {e}")))?;
        views.into_par_iter().zip(bytes.par_chunks(PIECE)).for_each(|(mut view, piece)| {
            view.slice(..piece.len()).copy_from_slice(piece);
        });
        buffer.unmap();
        Ok(buffer)
    }

    /// Copies a device tensor's logical bytes back to the host.
    pub fn read_back(&self, t: &DeviceTensor) -> Result<Vec<u8>, GpuError> {
        let size = t.buffer.size();
        let staging = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        enc.copy_buffer_to_buffer(&t.buffer, 0, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        self.wait()?;
        let view = staging.slice(..).get_mapped_range().map_err(|e| GpuError::Device(e.to_string()))?;
        let bytes = &view[..t.byte_length as usize];
        let mut host = Vec::new();
        host.try_reserve_exact(bytes.len())
            .map_err(|_| GpuError::OutOfMemory(format!("tensor {:?}: {} bytes of host memory", t.name, bytes.len())))?;
        host.extend_from_slice(bytes);
        Ok(host)
    }

    /// [`Gpu::read_back`] of a tensor decoded from `t`, checked against `t`'s digest (R26):
    /// what a reader that hands the bytes on should use.
    pub fn read_back_verified(&self, d: &DeviceTensor, t: &TensorEntry) -> Result<Vec<u8>, GpuError> {
        let data = self.read_back(d)?;
        check_digest(t, &data)?;
        Ok(data)
    }
}

//! A tensor decoded on the device.

use tpde_format::DType;

/// A tensor in device memory: its logical bytes, little-endian, in a storage buffer padded to
/// a multiple of 4 bytes.
#[derive(Debug)]
pub struct DeviceTensor {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Logical bytes (the buffer may be up to 3 bytes longer).
    pub byte_length: u64,
    pub(crate) buffer: wgpu::Buffer,
}

impl DeviceTensor {
    /// The storage buffer (usable as STORAGE, COPY_SRC and COPY_DST).
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

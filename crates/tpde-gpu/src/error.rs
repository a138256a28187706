//! The GPU decoder's one error type: a file's errors as the CPU reader gives them, and the
//! device's own.

use tpde_format::ErrorKind;
use tpde_read::ReadError;

/// Why the GPU decoder failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// The file (or its base) is broken or does not fit: the same error the CPU reader gives.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// No GPU adapter could be opened.
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    /// The device failed or lost a mapping.
    #[error("GPU device error: {0}")]
    Device(String),
    /// The device could not allocate what a file declares (its memory, or a readback's host
    /// memory): as host memory that cannot be had, `limit-exceeded`.
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),
    /// A tensor or chunk is too large for this device's buffers.
    #[error("tensor {name:?} does not fit the device: {detail}")]
    TooLarge {
        /// The tensor.
        name: String,
        /// What exceeds which limit.
        detail: String,
    },
}

impl GpuError {
    /// The error category (spec §9), for files; device problems are I/O.
    pub fn kind(&self) -> ErrorKind {
        match self {
            GpuError::Read(e) => e.kind(),
            GpuError::TooLarge { .. } | GpuError::OutOfMemory(_) => ErrorKind::LimitExceeded,
            GpuError::NoAdapter(_) | GpuError::Device(_) => ErrorKind::Io,
        }
    }
}

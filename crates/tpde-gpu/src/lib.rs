//! Decodes `.tpde` checkpoints on a GPU, bit-identical to the CPU reader (spec §6.7).
//!
//! The file is opened by `tpde-read` (memory-mapped; header, directory and CRCs are checked on
//! the host). Per tensor, only compressed bytes go to the device: rANS lanes, packed position
//! blocks, byte planes and the delta transforms are decoded there by WGSL compute kernels
//! (`shaders/decode.wgsl`); codecs with no parallel form (`zstd`, serial rANS, the
//! variable-length position coders) are decoded on the CPU and finished on the device. Deltas
//! decode against base tensors already resident on the device.
//!
//! - [`plan`]: the host half, chunks to batches of kernel jobs; no GPU API in it, so another
//!   backend (CUDA) could run the same batches.
//! - [`Gpu`]: the wgpu device and kernels: [`Gpu::decode`] one tensor, [`Gpu::read_back`].
//! - [`DeviceCheckpoint`], [`Gpu::load`], [`Gpu::load_chain`]: whole checkpoints, deltas on
//!   resident bases.
//! - [`LayerLoader`]: layer by layer, the next layer's host work and upload overlapping the
//!   current layer's decode.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checkpoint;
mod device;
pub mod plan;

pub use checkpoint::{layer_key, DeviceCheckpoint, Layer, LayerLoader};
pub use device::{DeviceTensor, Gpu, GpuError, Pending};

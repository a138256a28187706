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
//! - [`Gpu`]: the wgpu device and kernels: [`Gpu::decode`] one tensor, [`Gpu::submit_group`]
//!   many small ones in one set of dispatches, [`Gpu::read_back`]; uploads go through buffers
//!   mapped at creation and filled by every core (`transfer`).
//! - [`Pending`]: decodes submitted and not yet waited for, with their kernels' error codes.
//! - [`DeviceCheckpoint`], [`Gpu::load`], [`Gpu::load_chain`]: whole checkpoints, deltas on
//!   resident bases; runs of small keyframe tensors go up as groups.
//! - [`timing`]: the kernels' own device time, for benchmarks ([`Gpu::with_kernel_timing`]).
//! - [`LayerLoader`]: layer by layer, the next layer's host work and upload overlapping the
//!   current layer's decode.
//!
//! ```no_run
//! use tpde_gpu::{Gpu, LayerLoader};
//! use tpde_read::Reader;
//!
//! let gpu = Gpu::new()?; // the first high-performance adapter
//! // A delta and its chain of bases, decoded on the device (bases stay resident):
//! let ck = gpu.load_chain("step2000.tpde")?;
//! let w = ck.get("model.layers.0.mlp.w").unwrap(); // a DeviceTensor: w.buffer() is a wgpu::Buffer
//! let host: Vec<u8> = gpu.read_back(w)?;
//!
//! // Layer by layer: the next layer is read, planned and uploaded while this one decodes.
//! let base = gpu.load(&Reader::open("step1000.tpde")?, None)?;
//! let reader = Reader::open("step1010.tpde")?;
//! let mut layers = LayerLoader::new(&gpu, &reader, Some(&base))?;
//! while let Some(layer) = layers.next_layer() {
//!     let layer = layer?;
//!     println!("{}: {} tensors on the device", layer.key, layer.tensors.len());
//! }
//! # Ok::<(), tpde_gpu::GpuError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checkpoint;
mod device;
mod error;
mod pending;
pub mod plan;
mod predict;
mod tensor;
pub mod timing;
mod transfer;

pub use checkpoint::{layer_key, DeviceCheckpoint, Layer, LayerLoader};
pub use device::Gpu;
pub use error::GpuError;
pub use pending::Pending;
pub use tensor::DeviceTensor;
/// The wgpu this crate is built on: [`DeviceTensor::buffer`]'s type, for callers' own kernels.
pub use wgpu;

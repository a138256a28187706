//! What the decode kernels alone take, read from GPU timestamps ([`Gpu::with_kernel_timing`]):
//! no host planning, uploads or waits, so a benchmark can tell whether the kernels or the path
//! to the device bound a decode, and which kernel.
//!
//! [`Gpu::with_kernel_timing`]: crate::Gpu::with_kernel_timing

use std::time::Duration;

/// The kernels of `shaders/decode.wgsl`, in the order a batch runs them.
pub const KERNELS: [&str; 7] =
    ["build_tables", "decode_lanes", "decode_blocks", "scan_blocks", "unpack_blocks", "finish", "scatter"];

/// Device time per kernel, summed over the batches run since the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelTimes {
    /// Per kernel of [`KERNELS`], in its order.
    pub per_kernel: [Duration; KERNELS.len()],
    /// Batches timed.
    pub batches: u64,
    /// Threads the entropy decoders ran, over those batches (one a rANS lane, 32 a rANS block):
    /// against the tens of thousands a large GPU keeps resident, what bounds their occupancy.
    pub decode_threads: u64,
}

impl KernelTimes {
    /// All kernels together.
    pub fn total(&self) -> Duration {
        self.per_kernel.iter().sum()
    }
}

/// A resolved query lands at a multiple of this in the resolve buffer (wgpu's rule).
const SLOT: u64 = wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT;

/// The timestamp queries of one batch: a begin and an end per kernel pass.
pub(crate) struct BatchQueries {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    read: wgpu::Buffer,
    ran: [bool; KERNELS.len()],
}

impl BatchQueries {
    pub(crate) fn new(device: &wgpu::Device) -> BatchQueries {
        let set = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kernel timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * KERNELS.len() as u32,
        });
        let buffer = |label: &str, usage: wgpu::BufferUsages| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: SLOT * KERNELS.len() as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        BatchQueries {
            set,
            resolved: buffer("timestamps", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            read: buffer("timestamps readback", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            ran: [false; KERNELS.len()],
        }
    }

    /// The writes for kernel `k`'s pass.
    pub(crate) fn pass(&mut self, k: usize) -> wgpu::ComputePassTimestampWrites<'_> {
        self.ran[k] = true;
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * k as u32),
            end_of_pass_write_index: Some(2 * k as u32 + 1),
        }
    }

    /// Resolves the passes that ran (a kernel with no work has no pass, and its queries are
    /// never written) and copies them where the host can map them.
    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        for k in (0..KERNELS.len()).filter(|&k| self.ran[k]) {
            let q = 2 * k as u32;
            enc.resolve_query_set(&self.set, q..q + 2, &self.resolved, SLOT * k as u64);
        }
        enc.copy_buffer_to_buffer(&self.resolved, 0, &self.read, 0, self.read.size());
    }

    /// After the batch's submission has run: adds its kernel times to `into`.
    pub(crate) fn add_to(&self, device: &wgpu::Device, period_ns: f32, into: &mut KernelTimes) -> Result<(), String> {
        let slice = self.read.slice(..);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| e.to_string())?;
        let view = slice.get_mapped_range().map_err(|e| e.to_string())?;
        for k in (0..KERNELS.len()).filter(|&k| self.ran[k]) {
            let at = (SLOT * k as u64) as usize;
            let tick = |i: usize| u64::from_le_bytes(view[at + 8 * i..at + 8 * i + 8].try_into().expect("8 bytes"));
            let ticks = tick(1).saturating_sub(tick(0));
            into.per_kernel[k] += Duration::from_nanos((ticks as f64 * f64::from(period_ns)) as u64);
        }
        into.batches += 1;
        Ok(())
    }
}

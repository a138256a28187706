//! A model's layers decoded into wgpu buffers one at a time with `LayerLoader`, each used by a
//! kernel of the caller's own as soon as it is there, while the loader already reads, plans and
//! uploads the next layer.
//!
//! ```sh
//! tpde pack model.safetensors -o model.tpde        # a real model, packed once
//! cargo run --release -p tpde-gpu --example layers -- model.tpde
//! ```
//!
//! The "use" here is a checksum of each tensor's words (a wrapping sum, by a compute kernel
//! bound to the tensor's buffer), checked against the CPU reader's bytes at the end: a
//! stand-in for a forward pass that needs layer k while layer k + 1 is on its way. A delta
//! decodes against its base, loaded on the device first (its chain followed through hints).

use std::borrow::Cow;
use std::time::Instant;

use tpde_gpu::{Gpu, GpuError, LayerLoader};
use tpde_read::{chain, open_chain, PathHints};

/// Sums a tensor's words into one slot of the results, a grid-stride loop per thread.
const CHECKSUM: &str = r"
@group(0) @binding(0) var<storage, read> data: array<u32>;
@group(0) @binding(1) var<storage, read_write> sum: atomic<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * 256u;
    var acc = 0u;
    for (var i = id.x; i < arrayLength(&data); i += stride) {
        acc += data[i];
    }
    atomicAdd(&sum, acc);
}
";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: layers MODEL.tpde".into());
    };
    let gpu = Gpu::new()?;
    // A delta's base (and its chain) goes to the device first, found through the path hints.
    let mut links = chain::local_links(path, &PathHints::Follow)?;
    let base = links.get(1).map(|(base, _)| gpu.load_chain(base)).transpose()?;
    let (_, reader) = links.swap_remove(0);
    let user = Checksums::new(&gpu, reader.tensors().len());

    let start = Instant::now();
    let mut loader = LayerLoader::new(&gpu, &reader, base.as_ref())?;
    let (mut layers, mut bytes, mut names) = (0, 0u64, Vec::new());
    while let Some(layer) = loader.next_layer() {
        // Here the next layer is already submitted; this one is decoded and ready to use.
        let layer = layer?;
        for t in &layer.tensors {
            user.submit(&gpu, t.buffer(), names.len());
            bytes += t.byte_length;
            names.push(t.name.clone());
        }
        layers += 1;
    }
    let sums = user.read(&gpu)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{layers} layers, {} tensors, {:.1} MB decoded and used in {secs:.3} s ({:.2} GB/s) on {}",
        names.len(),
        bytes as f64 / 1e6,
        bytes as f64 / secs / 1e9,
        gpu.info().name
    );

    // The CPU reader's bytes give the same sums (the device's buffers are zero-padded words).
    let cpu = open_chain(path)?;
    for (name, &sum) in names.iter().zip(&sums) {
        let data = cpu.read(name)?;
        let want = data.chunks(4).fold(0u32, |acc, w| {
            let mut word = [0u8; 4];
            word[..w.len()].copy_from_slice(w);
            acc.wrapping_add(u32::from_le_bytes(word))
        });
        if want != sum {
            return Err(format!("{name}: the device's checksum {sum:#x} is not the CPU reader's {want:#x}").into());
        }
    }
    println!("every tensor's checksum matches the CPU reader");
    Ok(())
}

/// The caller's own kernel and where its results go: one 256-byte slot per tensor (a storage
/// binding's offset must be aligned).
struct Checksums {
    pipeline: wgpu::ComputePipeline,
    results: wgpu::Buffer,
    stride: u64,
}

impl Checksums {
    fn new(gpu: &Gpu, tensors: usize) -> Checksums {
        let device = gpu.device();
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("checksum"),
            source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(CHECKSUM)),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("checksum"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let stride = u64::from(device.limits().min_storage_buffer_offset_alignment).max(4);
        let results = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("checksums"),
            size: stride * tensors.max(1) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Checksums { pipeline, results, stride }
    }

    /// Queues the checksum of `tensor` into slot `slot`: after the decode that wrote it, on the
    /// same queue.
    fn submit(&self, gpu: &Gpu, tensor: &wgpu::Buffer, slot: usize) {
        let device = gpu.device();
        let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("checksum"),
            layout: &self.pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: tensor.as_entire_binding() },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.results,
                        offset: slot as u64 * self.stride,
                        size: std::num::NonZeroU64::new(4),
                    }),
                },
            ],
        });
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("checksum") });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(256, 1, 1);
        }
        gpu.queue().submit([enc.finish()]);
    }

    /// Every slot's sum, once the device has run everything queued.
    fn read(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let device = gpu.device();
        let back = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("checksums back"),
            size: self.results.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("checksums back") });
        enc.copy_buffer_to_buffer(&self.results, 0, &back, 0, self.results.size());
        gpu.queue().submit([enc.finish()]);
        back.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        gpu.synchronize()?;
        let view = back.slice(..).get_mapped_range().map_err(|e| GpuError::Device(e.to_string()))?;
        let words: &[u32] = bytemuck::cast_slice(&view);
        Ok(words.iter().step_by((self.stride / 4) as usize).copied().collect())
    }
}

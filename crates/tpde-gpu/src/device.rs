//! The wgpu half: the device, the six kernels of `shaders/decode.wgsl`, and running a
//! [`Batch`](crate::plan::Batch) of a tensor into a device buffer.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use tpde_format::TensorEntry;
use tpde_read::{chunk_location, ReadError, Reader, Source};
use wgpu::util::DeviceExt;

use crate::error::GpuError;
use crate::pending::{Pending, Submitted};
use crate::plan::{plan_chunk, Batch, Batcher, Limits};
use crate::tensor::DeviceTensor;
use crate::timing::{BatchQueries, KernelTimes, KERNELS};

/// Threads per workgroup of the one-thread-per-item kernels (the shader's `WG`).
const WG: u64 = 64;
/// Chunks planned on the CPU at a time (in parallel) before their batches go to the device.
const PLAN_GROUP: usize = 64;

/// The first adapter that is not a CPU, discrete GPUs before integrated ones.
fn hardware_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter, GpuError> {
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => 2,
        wgpu::DeviceType::Cpu => 3,
    };
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    let found: Vec<String> =
        adapters.iter().map(|a| format!("{} ({:?})", a.get_info().name, a.get_info().device_type)).collect();
    match adapters.into_iter().next() {
        Some(a) if a.get_info().device_type != wgpu::DeviceType::Cpu => Ok(a),
        _ => Err(GpuError::NoAdapter(format!(
            "TPDE_GPU_ADAPTER=hardware, and no adapter found is a GPU: {}",
            if found.is_empty() { "none".to_owned() } else { found.join(", ") }
        ))),
    }
}

struct Kernels {
    tables: wgpu::ComputePipeline,
    lanes: wgpu::ComputePipeline,
    rans_blocks: wgpu::ComputePipeline,
    scan: wgpu::ComputePipeline,
    unpack: wgpu::ComputePipeline,
    finish: wgpu::ComputePipeline,
    scatter: wgpu::ComputePipeline,
}

/// The decode kernels' source: `shaders/decode.wgsl`, and the block kernels' helpers for mode 7's
/// unchanged contexts (spec §6.4.2) in a file of their own.
const DECODE: [&str; 2] = [include_str!("shaders/decode.wgsl"), include_str!("shaders/unchanged.wgsl")];

/// The prediction kernel (`shaders/predict.wgsl`, spec §6.8) and its bindings.
pub(crate) struct Predictor {
    pub(crate) layout: wgpu::BindGroupLayout,
    pub(crate) pipeline: wgpu::ComputePipeline,
}

/// A GPU and the decode kernels compiled for it.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    layout: wgpu::BindGroupLayout,
    kernels: Kernels,
    pub(crate) predictor: Predictor,
    pub(crate) limits: Limits,
    pub(crate) max_buffer: u64,
    info: wgpu::AdapterInfo,
    dummy: wgpu::Buffer,
    /// Whether rANS blocks decode by the subgroup kernel.
    subgroups: bool,
    /// Bytes written from the host to the device so far (see [`Gpu::uploaded_bytes`]).
    uploaded: AtomicU64,
    /// Kernel times, when opened with [`Gpu::with_kernel_timing`].
    timing: Option<Mutex<KernelTimes>>,
    /// The first error wgpu reported outside an error scope (its default handler panics): given
    /// back by the next [`Gpu::scoped`] or wait.
    uncaptured: Arc<Mutex<Option<wgpu::Error>>>,
}

impl Gpu {
    /// Opens the first high-performance adapter of any backend wgpu supports here (Vulkan,
    /// Metal, DX12; Mesa's lavapipe counts), with its own limits. With the environment variable
    /// `TPDE_GPU_ADAPTER=hardware`, a CPU adapter (lavapipe, SwiftShader) does not count: with no
    /// other, this fails, naming the adapters it found, rather than measure a CPU as a GPU.
    pub fn new() -> Result<Gpu, GpuError> {
        Gpu::open(false, true)
    }

    /// [`Gpu::new`] without subgroup operations: rANS blocks decode by the workgroup kernel,
    /// the path of adapters that have none (for tests and comparisons on those that do).
    pub fn without_subgroups() -> Result<Gpu, GpuError> {
        Gpu::open(false, false)
    }

    /// Whether rANS blocks decode with subgroup ballots and shuffles here (the adapter has
    /// them, at least 4 lanes wide) rather than through workgroup memory.
    pub fn uses_subgroups(&self) -> bool {
        self.subgroups
    }

    /// [`Gpu::new`], and every batch's kernels timed on the device ([`Gpu::take_kernel_times`]).
    /// For benchmarks: each batch is waited for before the next is uploaded, so decodes are
    /// slower. Fails where the adapter has no timestamp queries.
    pub fn with_kernel_timing() -> Result<Gpu, GpuError> {
        Gpu::open(true, true)
    }

    fn open(timing: bool, subgroups: bool) -> Result<Gpu, GpuError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = match std::env::var("TPDE_GPU_ADAPTER").as_deref() {
            Ok("hardware") => hardware_adapter(&instance)?,
            Ok(other) if !other.is_empty() => {
                return Err(GpuError::NoAdapter(format!(
                    "TPDE_GPU_ADAPTER={other:?}: the one value known is \"hardware\""
                )))
            }
            _ => pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            }))
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?,
        };
        let have = adapter.limits();
        let required = wgpu::Limits {
            max_storage_buffer_binding_size: have.max_storage_buffer_binding_size,
            max_buffer_size: have.max_buffer_size,
            max_storage_buffers_per_shader_stage: 7,
            ..wgpu::Limits::downlevel_defaults()
        };
        let mut required_features = if timing { wgpu::Features::TIMESTAMP_QUERY } else { wgpu::Features::empty() };
        if !adapter.features().contains(required_features) {
            return Err(GpuError::NoAdapter(format!("{} has no timestamp queries", adapter.get_info().name)));
        }
        // The subgroup kernel needs lanes in fours (its shuffles) and at most 8 subgroups.
        let info = adapter.get_info();
        let subgroups =
            subgroups && adapter.features().contains(wgpu::Features::SUBGROUP) && info.subgroup_min_size >= 4;
        if subgroups {
            required_features |= wgpu::Features::SUBGROUP;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tpde-gpu"),
            required_features,
            required_limits: required.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let limits = Limits {
            // Offsets keep bit 31 free for the kernels' source flag.
            max_binding: required.max_storage_buffer_binding_size.min(1 << 31) / 256 * 256,
            offset_align: u64::from(device.limits().min_storage_buffer_offset_alignment).max(4),
        };
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("tpde decode"),
            source: wgpu::ShaderSource::Wgsl(Cow::Owned(DECODE.join("\n"))),
        });
        let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("tpde decode"),
            entries: &[
                storage(0, true),
                storage(1, true),
                storage(2, false),
                storage(3, false),
                storage(4, false),
                storage(5, true),
                storage(6, false),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("tpde decode"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let kernel = |entry: &str| pipeline(&device, &pipeline_layout, &module, entry);
        // decode.wgsl again with the subgroup kernel appended (naga takes subgroup operations
        // once the device has the feature). A driver that cannot build it gets the workgroup
        // kernel instead of a panic.
        let subgroup_kernel = subgroups
            .then(|| {
                let invalid = device.push_error_scope(wgpu::ErrorFilter::Validation);
                let source = [&DECODE[..], &[include_str!("shaders/blocks_subgroups.wgsl")]].concat();
                let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("tpde decode, subgroups"),
                    source: wgpu::ShaderSource::Wgsl(Cow::Owned(source.join("\n"))),
                });
                let kernel = pipeline(&device, &pipeline_layout, &module, "decode_blocks_subgroups");
                pollster::block_on(invalid.pop()).is_none().then_some(kernel)
            })
            .flatten();
        let subgroups = subgroup_kernel.is_some();
        let kernels = Kernels {
            tables: kernel("build_tables"),
            lanes: kernel("decode_lanes"),
            rans_blocks: subgroup_kernel.unwrap_or_else(|| kernel("decode_blocks")),
            scan: kernel("scan_blocks"),
            unpack: kernel("unpack_blocks"),
            finish: kernel("finish"),
            scatter: kernel("scatter"),
        };
        let predictor = {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("tpde predict"),
                source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(include_str!("shaders/predict.wgsl"))),
            });
            let mut entries = vec![storage(0, true), storage(1, true), storage(2, true), storage(3, false)];
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: 4,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("tpde predict"),
                entries: &entries,
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("tpde predict"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            Predictor { pipeline: pipeline(&device, &pipeline_layout, &module, "predict"), layout }
        };
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("no base"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let max_buffer = device.limits().max_buffer_size;
        let uncaptured: Arc<Mutex<Option<wgpu::Error>>> = Arc::default();
        let slot = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e| {
            slot.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        }));
        Ok(Gpu {
            device,
            queue,
            layout,
            kernels,
            predictor,
            limits,
            max_buffer,
            info: adapter.get_info(),
            dummy,
            subgroups,
            uploaded: AtomicU64::new(0),
            timing: timing.then(|| Mutex::new(KernelTimes::default())),
            uncaptured,
        })
    }

    /// Caps the bytes one batch binds (never above the device's own limit): smaller batches
    /// bound the host memory a batch takes, and let tests split tensors into many batches.
    pub fn limit_batches(&mut self, bytes: u64) {
        self.limits.max_binding = self.limits.max_binding.min(bytes.max(self.limits.offset_align * 4));
    }

    /// Bytes written from the host to the device since this `Gpu` was opened: tensors
    /// uploaded as they are, stored chunk bytes (or CPU-decoded ones for the codecs the device
    /// does not decode) and the batches' metadata. What a decode costs the host-device link.
    pub fn uploaded_bytes(&self) -> u64 {
        self.uploaded.load(Ordering::Relaxed)
    }

    /// The kernels' device time since the last call (and resets it), if opened with
    /// [`Gpu::with_kernel_timing`].
    pub fn take_kernel_times(&self) -> Option<KernelTimes> {
        let timing = self.timing.as_ref()?;
        Some(std::mem::take(&mut *timing.lock().unwrap_or_else(|e| e.into_inner())))
    }

    pub(crate) fn count_upload(&self, bytes: usize) {
        self.uploaded.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The adapter: name, backend, driver.
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The wgpu device, for callers that use the tensors' buffers in their own kernels.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue the decoder submits to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Decodes tensor `t` of `reader` into a new device buffer, uploading only what its chunks
    /// need: stored bytes for the codecs the device decodes, CPU-decoded bytes for the others
    /// (spec §6.7). A delta's chunks decode against `base`, the base tensor already on the
    /// device. Errors are the CPU reader's: the same categories for the same files.
    pub fn decode<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        t: &TensorEntry,
        base: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, GpuError> {
        self.submit(reader, t, base)?.finish(self)
    }

    /// The first half of [`Gpu::decode`]: plans the chunks, uploads them and submits the
    /// kernels, without waiting for the device. The layer loader prepares the next layer this
    /// way while the device decodes the current one.
    pub fn submit<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        t: &TensorEntry,
        base: Option<&DeviceTensor>,
    ) -> Result<Pending, GpuError> {
        check_size(reader, t)?;
        let base = if reader.tensor_uses_base(t) { Some(self.check_base(reader, t, base)?) } else { None };
        let out = self.tensor_buffer(&t.name, t.byte_length)?;
        let batches = self.submit_into(reader, &[t], &[0], &out, base)?;
        Ok(Pending::new(vec![t.clone()], vec![self.device_tensor(t, out)], batches, None))
    }

    /// [`Gpu::submit`] of several tensors whose chunks need no base (a keyframe's), as one:
    /// their chunks decode side by side into one device buffer, a set of dispatches for them
    /// all, and each tensor is then copied into its own buffer on the device. For the many
    /// small tensors of a model (norms, biases) this is one dispatch per kernel, not one per
    /// tensor. [`Pending::finish_all`] gives them in the order given.
    pub fn submit_group<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        tensors: &[&TensorEntry],
    ) -> Result<Pending, GpuError> {
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut total = 0;
        for t in tensors {
            check_size(reader, t)?;
            if reader.tensor_uses_base(t) {
                return Err(GpuError::Device(format!("tensor {:?} needs its base: submit it alone", t.name)));
            }
            offsets.push(total);
            total += t.byte_length.next_multiple_of(4).max(4);
        }
        let group = self.tensor_buffer("tpde group", total)?;
        let outs = tensors
            .iter()
            .map(|t| Ok(self.device_tensor(t, self.tensor_buffer(&t.name, t.byte_length)?)))
            .collect::<Result<Vec<_>, GpuError>>()?;
        let batches = self.submit_into(reader, tensors, &offsets, &group, None)?;
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tpde group") });
        for (out, &at) in outs.iter().zip(&offsets) {
            enc.copy_buffer_to_buffer(&group, at, &out.buffer, 0, out.buffer.size());
        }
        let copied = self.scoped(|| self.queue.submit([enc.finish()]))?;
        Ok(Pending::new(tensors.iter().map(|&t| t.clone()).collect(), outs, batches, Some(copied)))
    }

    /// Plans, uploads and runs the chunks of `tensors`, tensor `k`'s bytes at `offsets[k]` of
    /// `out`; chunks are numbered across the tensors, in order, for the errors.
    fn submit_into<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        tensors: &[&TensorEntry],
        offsets: &[u64],
        out: &wgpu::Buffer,
        base: Option<&wgpu::Buffer>,
    ) -> Result<Vec<Submitted>, GpuError> {
        let ids: Vec<(usize, usize)> =
            tensors.iter().enumerate().flat_map(|(k, t)| (0..t.chunks.len()).map(move |i| (k, i))).collect();
        let mut batcher = Batcher::new(self.limits);
        let mut batches = Vec::new();
        for (from, group) in ids.chunks(PLAN_GROUP).enumerate() {
            let works: Vec<_> = group
                .par_iter()
                .enumerate()
                .map(|(j, &(k, i))| {
                    let (t, c) = (tensors[k], &tensors[k].chunks[i]);
                    let stored = reader.chunk_bytes(t, i)?;
                    let mut work = plan_chunk(t.dtype, from * PLAN_GROUP + j, i + 1 == t.chunks.len(), c, &stored)
                        .map_err(|source| ReadError::Codec { location: chunk_location(t, i, c), source })?;
                    work.shift(offsets[k]);
                    Ok::<_, ReadError>(work)
                })
                .collect::<Result<_, _>>()?;
            for work in works {
                if let Some(bytes) = work.direct_upload() {
                    self.queue.write_buffer(out, work.out.start, bytes);
                    self.count_upload(bytes.len());
                    continue;
                }
                let name = &tensors[ids[work.index].0].name;
                let full = batcher.push(work).map_err(|detail| GpuError::TooLarge { name: name.clone(), detail })?;
                batches.extend(full.map(|b| self.scoped(|| self.run(&b, out, base)).and_then(|r| r)).transpose()?);
            }
        }
        batches.extend(batcher.flush().map(|b| self.scoped(|| self.run(&b, out, base)).and_then(|r| r)).transpose()?);
        Ok(batches)
    }

    fn device_tensor(&self, t: &TensorEntry, buffer: wgpu::Buffer) -> DeviceTensor {
        DeviceTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            byte_length: t.byte_length,
            buffer,
        }
    }

    fn check_base<'a, S: Source>(
        &self,
        reader: &Reader<S>,
        t: &TensorEntry,
        base: Option<&'a DeviceTensor>,
    ) -> Result<&'a wgpu::Buffer, GpuError> {
        let Some(b) = base else {
            return Err(reader.base_missing().into());
        };
        if b.dtype != t.dtype || b.shape != t.shape {
            return Err(ReadError::BaseTensor {
                name: t.name.clone(),
                detail: format!("the base's is {} {:?}, the file's {} {:?}", b.dtype, b.shape, t.dtype, t.shape),
            }
            .into());
        }
        Ok(&b.buffer)
    }

    /// Uploads a batch and submits its kernels.
    fn run(&self, batch: &Batch, out: &wgpu::Buffer, base: Option<&wgpu::Buffer>) -> Result<Submitted, GpuError> {
        let d = &self.device;
        let init = |label: &str, contents: &[u8]| {
            d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        let blob = self.filled("blob", &batch.blob, wgpu::BufferUsages::STORAGE)?;
        let meta = init("meta", bytemuck::cast_slice(&batch.meta));
        self.count_upload(batch.blob.len() + std::mem::size_of_val(batch.meta.as_slice()));
        let scratch_like = |label: &str, bytes: u64, usage: wgpu::BufferUsages| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.next_multiple_of(4).max(16),
                usage: wgpu::BufferUsages::STORAGE | usage,
                mapped_at_creation: false,
            })
        };
        let scratch = scratch_like("scratch", batch.scratch_words * 4, wgpu::BufferUsages::empty());
        let tables = scratch_like("tables", u64::from(batch.tables) * 4096 * 4, wgpu::BufferUsages::empty());
        let err_bytes = batch.chunks.len() as u64 * 4;
        let err = scratch_like("errors", err_bytes, wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST);
        let err_read = d.create_buffer(&wgpu::BufferDescriptor {
            label: Some("errors readback"),
            size: err_bytes.next_multiple_of(4).max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let win = &batch.window;
        let resources = [
            blob.as_entire_binding(),
            meta.as_entire_binding(),
            scratch.as_entire_binding(),
            tables.as_entire_binding(),
            window_binding(out, win),
            base.map_or(self.dummy.as_entire_binding(), |b| window_binding(b, win)),
            err.as_entire_binding(),
        ];
        let bind = self.bind_group("tpde decode", &self.layout, resources);
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tpde decode") });
        enc.clear_buffer(&err, 0, None);
        // One pass per kernel: each reads what the one before wrote.
        let k = &self.kernels;
        let steps: [(&wgpu::ComputePipeline, [u32; 3]); KERNELS.len()] = [
            (&k.tables, [batch.tables, 16, 1]),
            (&k.lanes, groups(batch.lanes)),
            (&k.rans_blocks, workgroups(batch.rans_blocks)),
            (&k.scan, [batch.packed, 1, 1]),
            (&k.unpack, groups(batch.blocks)),
            (&k.finish, groups(batch.words)),
            (&k.scatter, groups(batch.changed)),
        ];
        let mut queries = self.timing.as_ref().map(|_| BatchQueries::new(d));
        for (k, (pipeline, [x, y, z])) in steps.into_iter().enumerate() {
            if x == 0 {
                continue;
            }
            let timestamp_writes = queries.as_mut().map(|q| q.pass(k));
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(x, y, z);
        }
        enc.copy_buffer_to_buffer(&err, 0, &err_read, 0, err_read.size());
        if let Some(q) = &queries {
            q.resolve(&mut enc);
        }
        let index = self.queue.submit([enc.finish()]);
        if let (Some(q), Some(timing)) = (&queries, &self.timing) {
            let mut times = timing.lock().unwrap_or_else(|e| e.into_inner());
            // A failed read leaves this batch untimed; the decode itself reports device errors.
            let _ = q.add_to(d, self.queue.get_timestamp_period(), &mut times);
            times.decode_threads += u64::from(batch.lanes) + 32 * u64::from(batch.rans_blocks);
        }
        Ok(Submitted { chunks: batch.chunks.clone(), errors: err_read, index })
    }

    /// A bind group of `resources` at bindings 0, 1, ... in order.
    pub(crate) fn bind_group<'a>(
        &self,
        label: &str,
        layout: &wgpu::BindGroupLayout,
        resources: impl IntoIterator<Item = wgpu::BindingResource<'a>>,
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = resources
            .into_iter()
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout, entries: &entries })
    }

    /// Runs `f`, turning the validation and out-of-memory errors wgpu reports for it into a
    /// [`GpuError`] (wgpu's default is to panic).
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T, GpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let invalid = pollster::block_on(invalid.pop());
        let oom = pollster::block_on(oom.pop());
        match oom.or(invalid) {
            Some(e) => Err(device_error(e)),
            None => self.uncaptured().map(|()| value),
        }
    }

    /// The error wgpu reported outside a scope since the last call, if any.
    fn uncaptured(&self) -> Result<(), GpuError> {
        match self.uncaptured.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(device_error(e)),
            None => Ok(()),
        }
    }

    pub(crate) fn wait(&self) -> Result<(), GpuError> {
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Device(e.to_string()))?;
        self.uncaptured()
    }

    pub(crate) fn wait_for(&self, index: wgpu::SubmissionIndex) -> Result<(), GpuError> {
        let poll = wgpu::PollType::Wait { submission_index: Some(index), timeout: None };
        self.device.poll(poll).map_err(|e| GpuError::Device(e.to_string()))?;
        self.uncaptured()
    }

    /// Flushes pending uploads and waits until everything submitted so far has run (for
    /// timing: a decoded tensor is usable at once, since later GPU work is ordered after it).
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.queue.submit([]);
        self.wait()
    }
}

/// A wgpu error as the decoder's: memory the device cannot give is [`GpuError::OutOfMemory`].
fn device_error(e: wgpu::Error) -> GpuError {
    match e {
        wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory(e.to_string()),
        e => GpuError::Device(e.to_string()),
    }
}

/// The compute pipeline of `module`'s kernel `entry`.
fn pipeline(
    device: &wgpu::Device,
    layout: &wgpu::PipelineLayout,
    module: &wgpu::ShaderModule,
    entry: &str,
) -> wgpu::ComputePipeline {
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: Some(layout),
        module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// The bytes `window` of a tensor buffer, as a binding.
pub(crate) fn window_binding<'a>(buffer: &'a wgpu::Buffer, window: &std::ops::Range<u64>) -> wgpu::BindingResource<'a> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer,
        offset: window.start,
        size: std::num::NonZeroU64::new(window.end - window.start),
    })
}

/// Workgroups for one thread per item, spread over two dimensions past 65 535.
pub(crate) fn groups(items: u32) -> [u32; 3] {
    workgroups(items.div_ceil(WG as u32))
}

/// A dispatch of `n` workgroups, as `x · y` with x ≤ 65 535 (the kernels find theirs as
/// `wg.y · nwg.x + wg.x` and skip those past `n`).
fn workgroups(n: u32) -> [u32; 3] {
    let n = u64::from(n);
    let x = n.min(65_535);
    let y = if x == 0 { 0 } else { n.div_ceil(x) };
    [x as u32, y as u32, 1]
}

/// A tensor's decoded size against the reader's limit, before anything is allocated.
fn check_size<S: Source>(reader: &Reader<S>, t: &TensorEntry) -> Result<(), GpuError> {
    let limit = reader.options().max_tensor_bytes;
    if t.byte_length > limit {
        return Err(ReadError::TooLarge { name: t.name.clone(), bytes: t.byte_length, limit }.into());
    }
    Ok(())
}

impl Pending {
    /// [`Pending::finish_all`] of a tensor submitted alone ([`Gpu::submit`]): the tensor.
    pub fn finish(self, gpu: &Gpu) -> Result<DeviceTensor, GpuError> {
        let mut tensors = self.finish_all(gpu)?;
        match tensors.len() {
            1 => Ok(tensors.remove(0)),
            n => Err(GpuError::Device(format!("{n} tensors pending together: use finish_all"))),
        }
    }

    /// Waits for the device and returns the tensors, in the order submitted, or the reader's
    /// error for the first chunk (in file order) that a kernel found malformed.
    pub fn finish_all(self, gpu: &Gpu) -> Result<Vec<DeviceTensor>, GpuError> {
        let Some(index) = self.last_index() else { return self.checked() };
        self.map_errors();
        gpu.wait_for(index)?;
        self.checked()
    }
}

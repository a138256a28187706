//! Predicted tensors on the device (spec §6.8): what their chunks decode against, computed by
//! the kernel of `shaders/predict.wgsl` from tensors already resident.

use tpde_format::{CodecTag, Prediction, TensorEntry};
use wgpu::util::DeviceExt;

use crate::device::{groups, window_binding, Gpu};
use crate::error::GpuError;
use crate::tensor::DeviceTensor;

impl Gpu {
    /// The bytes a predicted tensor `t` decodes against (spec §6.8): for its `delta-predicted`
    /// chunks their prediction, computed on the device from `base` (the base's tensor of its
    /// name), `exp_avg` and `other` (the inputs of [`tpde_codec::predicted::Inputs`]: resident
    /// and decoded); for its other delta chunks the base's
    /// bytes. The caller checked the inputs' dtypes and shapes.
    pub fn prediction_base<'a>(
        &self,
        t: &TensorEntry,
        base: &DeviceTensor,
        inputs: impl Fn(&Prediction) -> Result<(&'a DeviceTensor, &'a DeviceTensor), GpuError>,
    ) -> Result<DeviceTensor, GpuError> {
        let out = self.tensor_buffer(&t.name, t.byte_length)?;
        let mut enc =
            self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tpde predict") });
        // Pieces of at most this many bytes, so that every binding fits the device's limit
        // after its offset is aligned down.
        let piece = (self.limits.max_binding - self.limits.offset_align) / 4 * 4;
        for c in &t.chunks {
            let (from, len) = (c.element_start * 4, c.decoded_length);
            if c.codec != CodecTag::DeltaPredicted {
                if c.codec.needs_base() {
                    enc.copy_buffer_to_buffer(&base.buffer, from, &out, from, len);
                }
                continue;
            }
            let p = Prediction::parse(&c.params).map_err(|e| GpuError::Device(format!("validated params: {e}")))?;
            let (m, other) = inputs(&p)?;
            let k = p.constants();
            let mut at = from;
            while at < from + len {
                let end = (at + piece).min(from + len);
                let offset = at / self.limits.offset_align * self.limits.offset_align;
                let window = offset..end;
                let mut job = [p.code() as u32, ((end - at) / 4) as u32, ((at - offset) / 4) as u32, 0, 0, 0, 0, 0];
                for (slot, v) in job[4..].iter_mut().zip(&k) {
                    *slot = v.to_bits();
                }
                let uniform = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("predict job"),
                    contents: bytemuck::cast_slice(&job),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
                let resources = [
                    window_binding(&base.buffer, &window),
                    window_binding(&m.buffer, &window),
                    window_binding(&other.buffer, &window),
                    window_binding(&out, &window),
                    uniform.as_entire_binding(),
                ];
                let bind = self.bind_group("tpde predict", &self.predictor.layout, resources);
                let [x, y, z] = groups(job[1]);
                let mut pass =
                    enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
                pass.set_pipeline(&self.predictor.pipeline);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(x, y, z);
                drop(pass);
                at = end;
            }
        }
        self.scoped(|| self.queue.submit([enc.finish()]))?;
        Ok(DeviceTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            byte_length: t.byte_length,
            buffer: out,
        })
    }
}

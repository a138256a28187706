//! Whole checkpoints on the device: decoded files, chains of deltas on resident bases, and the
//! layer-by-layer loader.

use std::collections::HashMap;
use std::path::Path;

use tpde_format::digest::{to_hex, Digest};
use tpde_format::{CodecTag, DType, Operand, Prediction, TensorEntry};
use tpde_read::chain;
use tpde_read::{PathHints, ReadError, Reader, Source};

use crate::device::Gpu;
use crate::error::GpuError;
use crate::pending::Pending;
use crate::tensor::DeviceTensor;

/// A checkpoint resident on the device, with the content digest (spec §7.2) of the file it was
/// decoded from: what a delta checks before decoding against it.
#[derive(Debug)]
pub struct DeviceCheckpoint {
    digest: Digest,
    tensors: Vec<DeviceTensor>,
    index: HashMap<String, usize>,
}

impl DeviceCheckpoint {
    /// Tensors already on the device, under the content digest of the checkpoint they form.
    pub fn new(digest: Digest, tensors: Vec<DeviceTensor>) -> DeviceCheckpoint {
        let index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        DeviceCheckpoint { digest, tensors, index }
    }

    /// The content digest.
    pub fn content_digest(&self) -> &Digest {
        &self.digest
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&DeviceTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Every tensor, in the file's directory order.
    pub fn tensors(&self) -> &[DeviceTensor] {
        &self.tensors
    }
}

/// Checks that `base` is the checkpoint `reader` was written against (as the CPU reader's
/// `with_base` does), naming both digests if not.
fn check_base_digest<S: Source>(reader: &Reader<S>, base: Option<&DeviceCheckpoint>) -> Result<(), GpuError> {
    let Some(base) = base else { return Ok(()) };
    let Some(want) = &reader.directory().base else {
        return Err(ReadError::NotADelta.into());
    };
    if want.digest != base.digest {
        return Err(ReadError::BaseMismatch { expected: to_hex(&want.digest), found: to_hex(&base.digest) }.into());
    }
    Ok(())
}

/// Tensors of at most this many bytes whose chunks need no base are submitted in groups.
const SMALL: u64 = 4 << 20;
/// A group's bytes at most: its shared buffer takes that much more device memory for a moment.
const GROUP_BYTES: u64 = 64 << 20;

/// `indices` of `reader`'s tensors as submits, in order: runs of small tensors that need no
/// base together ([`Gpu::submit_group`], a dispatch per kernel for them all), the rest alone.
fn submits<S: Source>(reader: &Reader<S>, indices: &[usize]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let (mut bytes, mut open) = (0, false);
    for &i in indices {
        let t = &reader.tensors()[i];
        let small = t.byte_length <= SMALL && !reader.tensor_uses_base(t);
        match out.last_mut() {
            Some(group) if small && open && bytes + t.byte_length <= GROUP_BYTES => group.push(i),
            _ => {
                out.push(vec![i]);
                open = small;
                bytes = 0;
            }
        }
        bytes += t.byte_length;
    }
    out
}

/// Whether a chunk of `t` is coded against a prediction (spec §6.8).
fn is_predicted(t: &TensorEntry) -> bool {
    t.chunks.iter().any(|c| c.codec == CodecTag::DeltaPredicted)
}

/// The base tensor `t` decodes against: `None` if it needs none or no base was given (the
/// decoder then reports the base missing), an error if the base lacks it.
fn base_tensor<'a, S: Source>(
    reader: &Reader<S>,
    t: &TensorEntry,
    base: Option<&'a DeviceCheckpoint>,
) -> Result<Option<&'a DeviceTensor>, GpuError> {
    match base {
        Some(b) if reader.tensor_uses_base(t) => match b.get(&t.name) {
            Some(bt) => Ok(Some(bt)),
            None => Err(ReadError::BaseTensor {
                name: t.name.clone(),
                detail: "the base has no tensor of that name".into(),
            }
            .into()),
        },
        _ => Ok(None),
    }
}

impl Gpu {
    /// Decodes every tensor of `reader` onto the device, deltas against `base` (resident). The
    /// next tensor is planned and uploaded while the device decodes the current one.
    pub fn load<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        base: Option<&DeviceCheckpoint>,
    ) -> Result<DeviceCheckpoint, GpuError> {
        check_base_digest(reader, base)?;
        let all = reader.tensors();
        let (plain, predicted): (Vec<usize>, Vec<usize>) = (0..all.len()).partition(|&i| !is_predicted(&all[i]));
        let mut slots: Vec<Option<DeviceTensor>> = (0..all.len()).map(|_| None).collect();
        for (&i, t) in plain.iter().zip(self.pipelined(reader, base, &plain)?) {
            slots[i] = Some(t);
        }
        // Predicted tensors (spec §6.8) once the tensors they read are decoded: validation (R30)
        // ruled out loops, so every round decodes at least one.
        let index: HashMap<&str, usize> = all.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
        let mut left = predicted;
        while !left.is_empty() {
            let ready = |i: usize| {
                all[i]
                    .chunks
                    .iter()
                    .filter_map(|c| Prediction::parse(&c.params).ok())
                    .all(|p| p.inputs().iter().all(|n| index.get(n).is_some_and(|&j| slots[j].is_some())))
            };
            let (now, later): (Vec<usize>, Vec<usize>) = left.iter().partition(|&&i| ready(i));
            assert!(!now.is_empty(), "R30 rules out predictions that read each other in a loop");
            for i in now {
                let t = &all[i];
                let b = base_tensor(reader, t, base)?.ok_or_else(|| reader.base_missing())?;
                let slots_now = &slots;
                // An operand: decoded before in this file, or a tensor of the base, which must be
                // f32 of the tensor's shape (R29).
                let operand = |(name, at): (&str, Operand)| match at {
                    Operand::File => Ok(slots_now[index[name]].as_ref().expect("decoded before")),
                    Operand::Base => match base.and_then(|b| b.get(name)) {
                        Some(x) if x.dtype == DType::F32 && x.shape == t.shape => Ok(x),
                        _ => Err(ReadError::BaseTensor {
                            name: name.to_owned(),
                            detail:
                                "a prediction reads it from the base, which has no f32 tensor of that name and shape"
                                    .into(),
                        }),
                    },
                };
                let effective = self.prediction_base(t, b, |p| {
                    let [first, second] = p.operands();
                    Ok((operand(first)?, operand(second)?))
                })?;
                let decoded = self.decode(reader, t, Some(&effective))?;
                slots[i] = Some(decoded);
            }
            left = later;
        }
        Ok(DeviceCheckpoint::new(
            reader.content_digest(),
            slots.into_iter().map(|t| t.expect("every tensor")).collect(),
        ))
    }

    /// Decodes the tensors at `indices`, submitting each before waiting for the one before.
    fn pipelined<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        base: Option<&DeviceCheckpoint>,
        indices: &[usize],
    ) -> Result<Vec<DeviceTensor>, GpuError> {
        let mut out = Vec::with_capacity(indices.len());
        let mut ahead: Option<Pending> = None;
        for group in submits(reader, indices) {
            let next = self.submit_indices(reader, &group, base)?;
            if let Some(p) = ahead.replace(next) {
                out.extend(p.finish_all(self)?);
            }
        }
        if let Some(p) = ahead {
            out.extend(p.finish_all(self)?);
        }
        Ok(out)
    }

    /// Submits `reader`'s tensors at `indices`: one alone (a delta's against its base tensor),
    /// several as a group.
    fn submit_indices<S: Source + Sync>(
        &self,
        reader: &Reader<S>,
        indices: &[usize],
        base: Option<&DeviceCheckpoint>,
    ) -> Result<Pending, GpuError> {
        let all = reader.tensors();
        match indices {
            [i] => self.submit(reader, &all[*i], base_tensor(reader, &all[*i], base)?),
            _ => self.submit_group(reader, &indices.iter().map(|&i| &all[i]).collect::<Vec<_>>()),
        }
    }

    /// Opens the file at `path` and decodes it onto the device; a delta's chain of bases is
    /// followed through the path hints (the walk of `tpde_read::chain`, as `open_chain` does)
    /// and decoded on the device too, each base resident while the file after it decodes.
    pub fn load_chain(&self, path: impl AsRef<Path>) -> Result<DeviceCheckpoint, GpuError> {
        self.load_chain_with(path, &PathHints::Follow)
    }

    /// [`Gpu::load_chain`], following only the hints `hints` allows.
    pub fn load_chain_with(&self, path: impl AsRef<Path>, hints: &PathHints) -> Result<DeviceCheckpoint, GpuError> {
        let links = chain::local_links(path, hints)?;
        let mut base: Option<DeviceCheckpoint> = None;
        for (_, reader) in links.iter().rev() {
            base = Some(self.load(reader, base.as_ref())?);
        }
        Ok(base.expect("a chain holds its first file"))
    }
}

/// The layer a tensor belongs to: its name up to the first all-digit component
/// (`model.layers.3.mlp.w` → `model.layers.3`), or without its last component when it has none
/// (`model.embed.weight` → `model.embed`).
pub fn layer_key(name: &str) -> &str {
    let mut end = 0;
    for part in name.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return &name[..end];
        }
        end += 1;
    }
    name.rsplit_once('.').map_or(name, |(head, _)| head)
}

/// One layer's tensors, decoded on the device.
#[derive(Debug)]
pub struct Layer {
    /// The layer's key ([`layer_key`]).
    pub key: String,
    /// Its tensors, in directory order.
    pub tensors: Vec<DeviceTensor>,
}

/// Materialises a checkpoint layer by layer, just in time: base tensors stay resident, each
/// layer is decoded when asked for, and while the device decodes it the next layer's chunks are
/// already read, planned and uploaded.
pub struct LayerLoader<'a, S: Source + Sync> {
    gpu: &'a Gpu,
    reader: &'a Reader<S>,
    base: Option<&'a DeviceCheckpoint>,
    layers: Vec<(String, Vec<usize>)>,
    next: usize,
    ahead: Option<(String, Vec<Pending>)>,
}

impl<'a, S: Source + Sync> LayerLoader<'a, S> {
    /// A loader over `reader`'s tensors grouped by [`layer_key`], in order of first appearance.
    pub fn new(gpu: &'a Gpu, reader: &'a Reader<S>, base: Option<&'a DeviceCheckpoint>) -> Result<Self, GpuError> {
        check_base_digest(reader, base)?;
        let mut layers: Vec<(String, Vec<usize>)> = Vec::new();
        let mut at: HashMap<&str, usize> = HashMap::new();
        for (i, t) in reader.tensors().iter().enumerate() {
            let key = layer_key(&t.name);
            let slot = *at.entry(key).or_insert_with(|| {
                layers.push((key.to_string(), Vec::new()));
                layers.len() - 1
            });
            layers[slot].1.push(i);
        }
        Ok(LayerLoader { gpu, reader, base, layers, next: 0, ahead: None })
    }

    /// The layers' keys, in the order [`LayerLoader::next_layer`] gives them.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.layers.iter().map(|(k, _)| k.as_str())
    }

    fn submit(&self, layer: usize) -> Result<(String, Vec<Pending>), GpuError> {
        let (key, indices) = &self.layers[layer];
        if let Some(t) = indices.iter().map(|&i| &self.reader.tensors()[i]).find(|t| is_predicted(t)) {
            return Err(GpuError::Device(format!(
                "tensor {:?} is predicted (delta-predicted): load the checkpoint whole (Gpu::load), which decodes the tensors it reads first",
                t.name
            )));
        }
        let pending = submits(self.reader, indices)
            .iter()
            .map(|group| self.gpu.submit_indices(self.reader, group, self.base))
            .collect::<Result<_, _>>()?;
        Ok((key.clone(), pending))
    }

    /// The next layer, decoded; `None` after the last.
    pub fn next_layer(&mut self) -> Option<Result<Layer, GpuError>> {
        if self.next >= self.layers.len() {
            return None;
        }
        let current = match self.ahead.take() {
            Some(p) => Ok(p),
            None => self.submit(self.next),
        };
        self.next += 1;
        // The next layer's host work and upload go ahead of waiting for this one.
        if self.next < self.layers.len() {
            match self.submit(self.next) {
                Ok(p) => self.ahead = Some(p),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(current.and_then(|(key, pending)| {
            let mut tensors = Vec::new();
            for p in pending {
                tensors.extend(p.finish_all(self.gpu)?);
            }
            Ok(Layer { key, tensors })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::layer_key;

    #[test]
    fn layer_keys() {
        assert_eq!(layer_key("model.layers.3.mlp.w"), "model.layers.3");
        assert_eq!(layer_key("h.10.attn"), "h.10");
        assert_eq!(layer_key("model.embed.weight"), "model.embed");
        assert_eq!(layer_key("step"), "step");
        assert_eq!(layer_key("a..b"), "a.");
    }
}

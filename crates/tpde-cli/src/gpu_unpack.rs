//! `tpde unpack --gpu`: a file decoded through the GPU decoder, read back and written as
//! safetensors. Here rather than in the `tpde` library so that only the tools depend on wgpu.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use tpde::open;
use tpde::safetensors::SafetensorsFile;
use tpde::unpack::{safetensors_metadata, unpack_report, write_unpacked, UnpackReport};
use tpde::{Location, Progress};

use crate::CliError;

/// [`tpde::unpack`] through the GPU decoder: the file (and, for a delta, its chain of bases, or a
/// `.safetensors` base uploaded as it is) decoded on the device, read back, and each tensor
/// checked against its digest before it is written.
pub fn unpack_gpu(
    input: &Location,
    base: Option<&Location>,
    output: &Path,
    opts: &open::OpenOptions,
    bar: &dyn Progress,
) -> Result<UnpackReport, CliError> {
    let start = Instant::now();
    let gpu = tpde_gpu::Gpu::new()?;
    let r = open::open_reader_with(input, opts.read)?;
    let hinted = match r.directory().base.as_ref() {
        Some(b) if !b.path_hint.is_empty() && r.uses_base() && base.is_none() => {
            Some(opts.hints.follow(input, &b.path_hint).map_err(|e| e.context(input))?)
        }
        _ => None,
    };
    let base_at = match base.cloned() {
        Some(b) => Some(b),
        None => hinted.filter(|b| b.is_file().unwrap_or(false)),
    };
    let base_ck = match base_at {
        None => None,
        Some(Location::Local(p)) if !open::is_tpde(&p)? => {
            let st = SafetensorsFile::open(&p)?;
            let tensors = st
                .tensors()
                .map(|(name, dtype, shape, data)| gpu.upload(name, dtype, shape, data))
                .collect::<Result<Vec<_>, _>>()?;
            Some(tpde_gpu::DeviceCheckpoint::new(tpde::read::Base::content_digest(&st)?, tensors))
        }
        // The chain decoded on the device from its keyframe up, each base resident while the
        // file after it decodes.
        Some(b) => {
            let mut ck = None;
            for (_, link) in open::chain_readers_with(&b, opts)?.iter().rev() {
                ck = Some(gpu.load(link, ck.as_ref())?);
            }
            ck
        }
    };
    let ck = gpu.load(&r, base_ck.as_ref())?;
    let on_device: HashMap<&str, _> = r.tensors().iter().map(|t| t.name.as_str()).zip(ck.tensors()).collect();
    let all: Vec<usize> = (0..r.tensors().len()).collect();
    bar.set_length(r.tensors().iter().map(|t| t.byte_length).sum());
    write_unpacked(
        &r,
        &all,
        &safetensors_metadata(&r),
        output,
        bar,
        |t| vec![t.byte_length],
        |t| {
            gpu.read_back_verified(on_device[t.name.as_str()], t).map_err(|e| tpde::Error::new(e.kind(), e.to_string()))
        },
        |bytes, _, _| Ok(bytes),
    )?;
    bar.finish();
    Ok(unpack_report(&r, start))
}

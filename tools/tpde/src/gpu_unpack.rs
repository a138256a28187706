//! `tpde unpack --gpu`: a file decoded through the GPU decoder, read back and written as
//! safetensors. Here rather than in the `tpde` library so that only the tools depend on wgpu.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use tpde::checkpoint::{self, SafetensorsFile};
use tpde::convert::{safetensors_metadata, unpack_report, write_unpacked, UnpackReport};
use tpde::Progress;
use tpde_read::Reader;

use crate::CliError;

/// [`tpde::convert::unpack`] through the GPU decoder: the file (and, for a delta, its chain of bases, or a
/// `.safetensors` base uploaded as it is) decoded on the device, read back, and each tensor
/// checked against its digest before it is written.
pub fn unpack_gpu(
    input: &Path,
    base: Option<&Path>,
    output: &Path,
    bar: &dyn Progress,
) -> Result<UnpackReport, CliError> {
    let start = Instant::now();
    let gpu = tpde_gpu::Gpu::new()?;
    let r = Reader::open(input)?;
    let base_path =
        base.map(Path::to_path_buf).or_else(|| tpde_read::hinted_base_path(input, &r).filter(|p| p.is_file()));
    let base_ck = match base_path {
        None => None,
        Some(p) if checkpoint::is_tpde(&p)? => Some(gpu.load_chain(&p)?),
        Some(p) => {
            let st = SafetensorsFile::open(&p)?;
            let tensors = st
                .tensors()
                .map(|(name, dtype, shape, data)| gpu.upload(name, dtype, shape, data))
                .collect::<Result<Vec<_>, _>>()?;
            Some(tpde_gpu::DeviceCheckpoint::new(tpde_read::Base::content_digest(&st)?, tensors))
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

//! safetensors ⇄ TPDE. Every tensor's bytes, dtype and shape survive bit-exact, and so does
//! the safetensors `__metadata__` map: its entries become TPDE string metadata under the same
//! keys, and come back out on unpack.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use indicatif::ProgressBar;
use safetensors::{Dtype as StDtype, SafeTensors, View};
use tpde_codec::Encoder;
use tpde_format::metadata::{KEY_PRODUCER, KEY_SOURCE_FORMAT, RESERVED_PREFIX};
use tpde_format::{DType, MetadataValue};
use tpde_read::Reader;
use tpde_write::{FileWriter, WriteOptions};

use crate::CliError;

/// The TPDE dtype of a safetensors dtype, if the registry has it.
pub fn dtype_from_safetensors(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::BOOL => DType::Bool,
        StDtype::U8 => DType::U8,
        StDtype::I8 => DType::I8,
        StDtype::I16 => DType::I16,
        StDtype::U16 => DType::U16,
        StDtype::I32 => DType::I32,
        StDtype::U32 => DType::U32,
        StDtype::I64 => DType::I64,
        StDtype::U64 => DType::U64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        StDtype::F8_E4M3 => DType::F8E4M3,
        StDtype::F8_E5M2 => DType::F8E5M2,
        _ => return None,
    })
}

/// The safetensors dtype of a TPDE dtype.
pub fn dtype_to_safetensors(d: DType) -> StDtype {
    match d {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I8 => StDtype::I8,
        DType::I16 => StDtype::I16,
        DType::U16 => StDtype::U16,
        DType::I32 => StDtype::I32,
        DType::U32 => StDtype::U32,
        DType::I64 => StDtype::I64,
        DType::U64 => StDtype::U64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F8E4M3 => StDtype::F8_E4M3,
        DType::F8E5M2 => StDtype::F8_E5M2,
        other => unreachable!("dtype {other} has no safetensors name"),
    }
}

/// What a pack did.
#[derive(Clone, Copy, Debug, Default)]
pub struct PackReport {
    /// Tensors written.
    pub tensors: u64,
    /// Logical tensor bytes.
    pub logical_bytes: u64,
    /// Stored chunk bytes.
    pub stored_bytes: u64,
    /// The output file's size.
    pub file_bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

fn st_error(path: &Path, e: safetensors::SafeTensorError) -> CliError {
    CliError::failed(format!("{}: not a valid safetensors file: {e}", path.display()))
}

/// Packs a safetensors file into a TPDE file.
pub fn pack(input: &Path, output: &Path, options: WriteOptions, bar: &ProgressBar) -> Result<PackReport, CliError> {
    let start = Instant::now();
    let map = tpde_read::map_file(input).map_err(|e| CliError::failed(format!("{}: {e}", input.display())))?;
    let (_, header) = SafeTensors::read_metadata(&map).map_err(|e| st_error(input, e))?;
    let st = SafeTensors::deserialize(&map).map_err(|e| st_error(input, e))?;

    let mut w = FileWriter::create(output, options)?;
    w.add_metadata(KEY_PRODUCER, MetadataValue::String(format!("tpde {}", env!("CARGO_PKG_VERSION"))))?;
    w.add_metadata(KEY_SOURCE_FORMAT, MetadataValue::String("safetensors".into()))?;
    if let Some(meta) = header.metadata() {
        let mut keys: Vec<&String> = meta.keys().collect();
        keys.sort();
        for k in keys {
            if k.starts_with(RESERVED_PREFIX) {
                return Err(CliError::failed(format!(
                    "{}: metadata key {k:?} is in TPDE's reserved `tpde.` namespace; rename it to pack this file",
                    input.display()
                )));
            }
            w.add_metadata(k.clone(), MetadataValue::String(meta[k].clone()))?;
        }
    }
    let names = header.offset_keys();
    let total: u64 = names.iter().filter_map(|n| st.tensor(n).ok()).map(|t| t.data().len() as u64).sum();
    bar.set_length(total);
    let mut report = PackReport::default();
    for name in &names {
        let t = st.tensor(name).map_err(|e| st_error(input, e))?;
        let dtype = dtype_from_safetensors(t.dtype()).ok_or_else(|| {
            CliError::failed(format!(
                "tensor {name:?}: safetensors dtype {:?} is not in TPDE's dtype registry",
                t.dtype()
            ))
        })?;
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        let entry = w.add_tensor(name, dtype, &shape, t.data())?;
        report.tensors += 1;
        report.logical_bytes += entry.byte_length;
        report.stored_bytes += entry.stored_length();
        bar.inc(entry.byte_length);
    }
    let file = w.finish()?;
    report.file_bytes = file.metadata()?.len();
    report.seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(report)
}

struct Tensor<'a> {
    dtype: StDtype,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl View for &Tensor<'_> {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// What an unpack did.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnpackReport {
    /// Tensors written.
    pub tensors: u64,
    /// Logical tensor bytes.
    pub logical_bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// The safetensors `__metadata__` map a TPDE file carries: every non-reserved entry, strings
/// as they are and other types in their text form.
pub fn safetensors_metadata<S: tpde_read::Source>(r: &Reader<S>) -> Option<HashMap<String, String>> {
    let map: HashMap<String, String> = r
        .directory()
        .metadata
        .iter()
        .filter(|m| !m.key.starts_with(RESERVED_PREFIX))
        .map(|m| (m.key.clone(), m.value.to_string()))
        .collect();
    (!map.is_empty()).then_some(map)
}

/// Decodes every tensor of a TPDE file (CRCs checked) and writes a safetensors file,
/// atomically (temporary file, then rename).
pub fn unpack(input: &Path, output: &Path, bar: &ProgressBar) -> Result<UnpackReport, CliError> {
    let start = Instant::now();
    let r = Reader::open(input)?;
    if let Some(base) = &r.directory().base {
        return Err(CliError::failed(format!(
            "{} is a delta against base {}; this version of tpde decodes keyframes only",
            input.display(),
            tpde_format::digest::to_hex(&base.digest)
        )));
    }
    bar.set_length(r.tensors().iter().map(|t| t.byte_length).sum());
    let mut tensors = Vec::with_capacity(r.tensors().len());
    for t in r.tensors() {
        let data = r.read_tensor(t)?;
        bar.inc(t.byte_length);
        let shape = t.shape.iter().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>();
        let shape =
            shape.map_err(|_| CliError::failed(format!("tensor {:?}: shape does not fit this platform", t.name)))?;
        tensors.push((t.name.clone(), Tensor { dtype: dtype_to_safetensors(t.dtype), shape, data }));
    }
    let logical_bytes = tensors.iter().map(|(_, t)| t.data.len() as u64).sum();
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new().prefix(".tpde-unpack.").suffix(".partial").tempfile_in(dir)?;
    safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.as_str(), t)), safetensors_metadata(&r), tmp.path())
        .map_err(|e| CliError::failed(format!("{}: writing safetensors failed: {e}", output.display())))?;
    tmp.as_file().sync_all()?;
    tmp.persist(output).map_err(|e| CliError::from(e.error))?;
    bar.finish_and_clear();
    Ok(UnpackReport { tensors: tensors.len() as u64, logical_bytes, seconds: start.elapsed().as_secs_f64() })
}

/// Compares every tensor (name, dtype, shape, bytes) and the metadata map of two safetensors
/// files; returns a description of the first difference.
pub fn compare_safetensors(a: &Path, b: &Path) -> Result<Option<String>, CliError> {
    let ma = tpde_read::map_file(a)?;
    let mb = tpde_read::map_file(b)?;
    let (_, ha) = SafeTensors::read_metadata(&ma).map_err(|e| st_error(a, e))?;
    let (_, hb) = SafeTensors::read_metadata(&mb).map_err(|e| st_error(b, e))?;
    let sa = SafeTensors::deserialize(&ma).map_err(|e| st_error(a, e))?;
    let sb = SafeTensors::deserialize(&mb).map_err(|e| st_error(b, e))?;
    let mut na = sa.names();
    let mut nb = sb.names();
    na.sort();
    nb.sort();
    if na != nb {
        return Ok(Some(format!("tensor names differ: {} vs {}", na.len(), nb.len())));
    }
    for n in na {
        let (ta, tb) = (sa.tensor(n).map_err(|e| st_error(a, e))?, sb.tensor(n).map_err(|e| st_error(b, e))?);
        if ta.dtype() != tb.dtype() || ta.shape() != tb.shape() || ta.data() != tb.data() {
            return Ok(Some(format!("tensor {n:?} differs")));
        }
    }
    let strip = |m: &Option<HashMap<String, String>>| m.clone().unwrap_or_default();
    if strip(ha.metadata()) != strip(hb.metadata()) {
        return Ok(Some("metadata differs".into()));
    }
    Ok(None)
}

/// Parses `raw` or `zstd` into an encoder.
pub fn encoder(codec: &str, level: Option<i32>) -> Result<Encoder, CliError> {
    match codec {
        "raw" if level.is_some() => Err(CliError::usage("--level applies to --codec zstd only")),
        "raw" => Ok(Encoder::Raw),
        "zstd" => {
            let level = level.unwrap_or(3);
            let range = zstd::compression_level_range();
            if !range.contains(&level) {
                return Err(CliError::usage(format!("--level {level} is outside zstd's {range:?}")));
            }
            Ok(Encoder::Zstd { level })
        }
        other => Err(CliError::usage(format!("unknown codec {other:?}: expected raw or zstd"))),
    }
}

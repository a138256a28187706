//! A folder of safetensors checkpoints packed as a chain: a keyframe every k files, each other
//! file a delta against the one before (closed loop when lossy).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use tpde_read::Base;
use tpde_write::WriteOptions;

use crate::location::Location;
use crate::memory::MemoryCheckpoint;
use crate::pack::{pack_file, PackJob, PackReport, Packed};
use crate::safetensors::SafetensorsFile;
use crate::{Error, ErrorKind, Progress};

/// What `pack-series` did, file by file.
#[derive(Clone, Debug)]
pub struct SeriesEntry {
    /// The checkpoint packed.
    pub input: std::path::PathBuf,
    /// The file written.
    pub output: Location,
    /// Whether it is a keyframe.
    pub keyframe: bool,
    /// The pack.
    pub report: PackReport,
}

/// Packs every `.safetensors` file of `dir` (in name order) into `out_dir` as a chain: a
/// keyframe every `keyframe_every` files, each other file a delta against the one before. With
/// a lossy bound the base of each delta is the previous file as it decodes (closed loop).
pub fn pack_series(
    dir: &Path,
    out_dir: &Location,
    keyframe_every: usize,
    options: WriteOptions,
    max_abs_error: Option<f64>,
    max_rel_error: Option<f64>,
    bar: &dyn Progress,
) -> Result<Vec<SeriesEntry>, Error> {
    if keyframe_every == 0 {
        return Err(Error::usage("--keyframe-every must be at least 1"));
    }
    let mut inputs: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::from(e).context(dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    inputs.sort();
    if inputs.is_empty() {
        return Err(Error::new(ErrorKind::NotFound, format!("{}: no .safetensors files", dir.display())));
    }
    out_dir.create_dir_all()?;
    let mut done = Vec::new();
    // The previous checkpoint as it decodes: its safetensors file when lossless, the kept
    // reconstruction when lossy.
    let mut prev: Option<(SafetensorsFile, Option<MemoryCheckpoint>, Location)> = None;
    for (i, input) in inputs.iter().enumerate() {
        let src = SafetensorsFile::open(input)?;
        let stem = input.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let output = out_dir.join(&format!("{stem}.tpde"))?;
        let keyframe = i % keyframe_every == 0;
        let base: Option<(&dyn Base, String)> = match (&prev, keyframe) {
            (Some((file, recon, out)), false) => {
                let b: &dyn Base = match recon {
                    Some(r) => r,
                    None => file,
                };
                Some((b, output.hint_to(out)))
            }
            _ => None,
        };
        let job = PackJob {
            options: options.clone(),
            max_abs_error: max_abs_error.filter(|_| base.is_some()),
            max_rel_error: max_rel_error.filter(|_| base.is_some()),
            exact: HashSet::new(),
            keep_reconstruction: max_abs_error.is_some() || max_rel_error.is_some(),
            predictions: HashMap::new(),
            base,
            #[cfg(feature = "object")]
            expect: crate::object::Expect::Anything,
        };
        let Packed { report, reconstruction: recon } = pack_file(&src, input, &output, job, bar)?;
        done.push(SeriesEntry { input: input.clone(), output: output.clone(), keyframe, report });
        prev = Some((src, recon, output));
    }
    Ok(done)
}

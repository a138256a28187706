//! `tpde._tpde.Stages`: a staged read (`tpde::read::staging`) for the device loads of
//! `tpde.torch`, which decode each stage into one buffer of a ring of pinned buffers while the
//! previous one is copied to the device.

use std::ops::Range;
use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use tpde::read::staging::{plan, slot_len, Stage};
use tpde::{FileReader, Location};

use crate::{invalid, py_err, File};

/// Requests `(name, start, end)` of a file, planned in stages of at most `slot` bytes.
#[pyclass(frozen, module = "tpde._tpde")]
pub(crate) struct Stages {
    reader: Arc<FileReader>,
    at: Location,
    /// Each request's tensor (an index into the file's tensors) and byte range.
    requests: Vec<(usize, Range<u64>)>,
    stages: Vec<Stage>,
    slot: u64,
}

#[pymethods]
impl Stages {
    /// Plans `requests` of `file` in slots of `slot_bytes`, or of the largest chunk they touch
    /// if that is larger (`slot` says which). A range outside its tensor, and a tensor over
    /// the file's `max_tensor_bytes`, are refused here.
    #[new]
    fn new(file: &Bound<'_, File>, requests: Vec<(String, u64, u64)>, slot_bytes: u64) -> PyResult<Self> {
        let file = file.get();
        let tensors = file.reader.tensors();
        let mut planned = Vec::with_capacity(requests.len());
        for (name, start, end) in &requests {
            let index = file.reader.tensor_index(name).map_err(|e| file.err(e))?;
            let t = &tensors[index];
            file.reader.check_size(t).map_err(|e| file.err(e))?;
            if start > end || *end > t.byte_length {
                return Err(invalid(format!(
                    "tensor {name:?}: byte range {start}..{end} outside 0..{}",
                    t.byte_length
                )));
            }
            planned.push((index, *start..*end));
        }
        let entries: Vec<_> = planned.iter().map(|(k, range)| (&tensors[*k], range.clone())).collect();
        let slot = slot_len(&entries, slot_bytes);
        let stages = plan(&entries, slot);
        Ok(Stages { reader: file.reader.clone(), at: file.at.clone(), requests: planned, stages, slot })
    }

    /// Bytes of the buffer each stage needs: the ring's slot.
    #[getter]
    fn slot(&self) -> u64 {
        self.slot
    }

    fn __len__(&self) -> usize {
        self.stages.len()
    }

    /// Stage `k`'s pieces, `(request, start, end, at)` each: bytes `start..end` of request
    /// `request`'s tensor, at byte `at` of the stage's buffer.
    fn pieces(&self, k: usize) -> PyResult<Vec<(usize, u64, u64, u64)>> {
        Ok(self.stage(k)?.pieces.iter().map(|p| (p.request, p.range.start, p.range.end, p.at)).collect())
    }

    /// Decodes stage `k` into `out` (a writable, contiguous `uint8` array of at least
    /// `slot` bytes, such as a pinned tensor's `.numpy()`), on every core, the GIL released.
    fn read(&self, py: Python<'_>, k: usize, out: Bound<'_, PyArray1<u8>>) -> PyResult<()> {
        let stage = self.stage(k)?;
        let mut rw = out.try_readwrite().map_err(|e| invalid(format!("a staging buffer cannot be written ({e})")))?;
        let buf = rw.as_slice_mut().map_err(|_| invalid("a staging buffer is not contiguous"))?;
        let tensors = self.reader.tensors();
        let requests: Vec<_> = self.requests.iter().map(|(t, range)| (&tensors[*t], range.clone())).collect();
        py.detach(|| self.reader.read_stage(&requests, stage, buf))
            .map_err(|e| py_err(tpde::Error::from(e).context(&self.at)))
    }
}

impl Stages {
    fn stage(&self, k: usize) -> PyResult<&Stage> {
        self.stages.get(k).ok_or_else(|| invalid(format!("stage {k} of {}", self.stages.len())))
    }
}

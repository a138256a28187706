//! The object-storage calls the `Checkpointer`'s writer lease and its fenced writes make
//! (`s3://` URLs), as thin wrappers over `tpde::object`.

use pyo3::prelude::*;

use crate::{invalid, py_err};

/// Writes `data` as a new object at URL `url` only if none is there (a conditional PUT):
/// whether this call created it. For the `Checkpointer`'s writer lease.
#[pyfunction]
pub(crate) fn object_create_new(py: Python<'_>, url: &str, data: Vec<u8>) -> PyResult<bool> {
    let url = tpde::object::ObjectUrl::parse(url).map_err(|e| invalid(e.to_string()))?;
    py.detach(|| tpde::object::put_new(&url, data)).map_err(|e| py_err(e.into()))
}

/// The version of the object at URL `url` a writer means to replace, for `save`'s `expect`:
/// its ETag, `""` if there is none, `None` if the store gives no ETag (no condition). Taken
/// before the writer checks its lease, it makes the save complete only if no other writer
/// replaced the object in between.
#[pyfunction]
pub(crate) fn object_version(py: Python<'_>, url: &str) -> PyResult<Option<String>> {
    use tpde::object::Expect;
    let url = tpde::object::ObjectUrl::parse(url).map_err(|e| invalid(e.to_string()))?;
    match py.detach(|| tpde::object::version(&url)).map_err(|e| py_err(e.into()))? {
        Expect::Anything => Ok(None),
        Expect::Absent => Ok(Some(String::new())),
        Expect::ETag(e) => Ok(Some(e)),
    }
}

/// `save`'s `expect`: `object_version`'s answer.
pub(crate) fn expected(version: Option<&str>) -> tpde::object::Expect {
    use tpde::object::Expect;
    match version {
        None => Expect::Anything,
        Some("") => Expect::Absent,
        Some(e) => Expect::ETag(e.to_owned()),
    }
}

/// Writes `data` as the object at URL `url` in one PUT, replacing any.
#[pyfunction]
pub(crate) fn object_write(py: Python<'_>, url: &str, data: Vec<u8>) -> PyResult<()> {
    let url = tpde::object::ObjectUrl::parse(url).map_err(|e| invalid(e.to_string()))?;
    py.detach(|| tpde::object::put(&url, data)).map_err(|e| py_err(e.into()))
}

/// The whole object at URL `url`, or `None` if there is none.
#[pyfunction]
pub(crate) fn object_read(py: Python<'_>, url: &str) -> PyResult<Option<Vec<u8>>> {
    let url = tpde::object::ObjectUrl::parse(url).map_err(|e| invalid(e.to_string()))?;
    match py.detach(|| tpde::object::get_all(&url)) {
        Ok(b) => Ok(Some(b.to_vec())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(py_err(e.into())),
    }
}

//! Object URLs: `s3://bucket/key`, and path hints (spec §7.3) resolved against them.

use std::fmt;
use std::io;

/// An object (or, with a key naming a "folder", a prefix) in a bucket: `s3://bucket/key`.
/// The key is kept normalized: components separated by single `/`, none empty, `.` or `..`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    bucket: String,
    key: String,
}

/// The schemes this crate reads and writes.
const SCHEMES: [&str; 2] = ["s3://", "s3a://"];

impl ObjectUrl {
    /// Whether `s` names an object by URL (`s3://...`) rather than a local path.
    pub fn is_url(s: &str) -> bool {
        s.contains("://")
    }

    /// Parses `s3://bucket/key` (or `s3a://`). The key may be empty (the whole bucket), and
    /// `.` and `..` components are resolved; one that would leave the bucket is an error.
    pub fn parse(s: &str) -> io::Result<Self> {
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{s:?}: {why}"));
        let rest = SCHEMES
            .iter()
            .find_map(|scheme| s.strip_prefix(scheme))
            .ok_or_else(|| invalid("not an object URL this build reads (s3://bucket/key)"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || !bucket.chars().all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)) {
            return Err(invalid("the bucket name is empty or not a valid S3 bucket name"));
        }
        let key = normalize(key.split('/')).ok_or_else(|| invalid("the key climbs out of the bucket with `..`"))?;
        Ok(ObjectUrl { bucket: bucket.to_owned(), key })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key (empty for the bucket's root).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The object `name` (one or more `/`-separated components) under this URL taken as a
    /// folder: `s3://b/ckpts` joined with `step-1.tpde` is `s3://b/ckpts/step-1.tpde`.
    pub fn join(&self, name: &str) -> io::Result<Self> {
        let joined = normalize(self.key.split('/').chain(name.split('/'))).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{self} joined with {name:?} climbs out of the bucket"))
        })?;
        Ok(ObjectUrl { bucket: self.bucket.clone(), key: joined })
    }

    /// The folder this object is in: its key without the last component.
    pub fn parent(&self) -> ObjectUrl {
        let key = self.key.rsplit_once('/').map_or("", |(dir, _)| dir);
        ObjectUrl { bucket: self.bucket.clone(), key: key.to_owned() }
    }

    /// The last component of the key.
    pub fn file_name(&self) -> &str {
        self.key.rsplit_once('/').map_or(&self.key, |(_, name)| name)
    }

    /// The relative path hint (spec §7.3) that leads from a file at `self` to `base` in the
    /// same bucket (`../step-1/rank-0.tpde`), or `None` for another bucket.
    pub fn relative_hint(&self, base: &ObjectUrl) -> Option<String> {
        if self.bucket != base.bucket {
            return None;
        }
        let parent = self.parent();
        let from: Vec<&str> = parent.key.split('/').filter(|c| !c.is_empty()).collect();
        let to: Vec<&str> = base.key.split('/').filter(|c| !c.is_empty()).collect();
        let to_dir = &to[..to.len().saturating_sub(1)];
        let common = from.iter().zip(to_dir).take_while(|(a, b)| a == b).count();
        let mut rel: Vec<&str> = vec![".."; from.len() - common];
        rel.extend(&to[common..]);
        Some(rel.join("/"))
    }

    /// The key as the store's path.
    pub(crate) fn path(&self) -> io::Result<object_store::path::Path> {
        if self.key.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{self}: names a bucket, not an object")));
        }
        self.path_or_root().map(|p| p.unwrap_or_default())
    }

    /// The key as the store's path, `None` for the bucket's root.
    pub(crate) fn path_or_root(&self) -> io::Result<Option<object_store::path::Path>> {
        if self.key.is_empty() {
            return Ok(None);
        }
        object_store::path::Path::parse(&self.key)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{self}: {e}")))
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// Components joined by `/` with empty and `.` ones dropped and `..` resolved; `None` if a
/// `..` has nothing left to remove.
fn normalize<'a>(components: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in components {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_joins_and_relates() {
        let u = ObjectUrl::parse("s3://ckpts/run-1//step-2/./rank-0.tpde").unwrap();
        assert_eq!((u.bucket(), u.key()), ("ckpts", "run-1/step-2/rank-0.tpde"));
        assert_eq!(u.to_string(), "s3://ckpts/run-1/step-2/rank-0.tpde");
        assert_eq!(u.parent().join("../step-1/rank-0.tpde").unwrap().key(), "run-1/step-1/rank-0.tpde");
        let base = ObjectUrl::parse("s3://ckpts/run-1/step-1/rank-0.tpde").unwrap();
        assert_eq!(u.relative_hint(&base).as_deref(), Some("../step-1/rank-0.tpde"));
        let beside = ObjectUrl::parse("s3://ckpts/run-1/step-2/base.tpde").unwrap();
        assert_eq!(u.relative_hint(&beside).as_deref(), Some("base.tpde"));
        let top = ObjectUrl::parse("s3://ckpts/a.tpde").unwrap();
        assert_eq!(top.relative_hint(&u).as_deref(), Some("run-1/step-2/rank-0.tpde"));
        assert_eq!(u.relative_hint(&top).as_deref(), Some("../../a.tpde"));
        assert_eq!(u.relative_hint(&ObjectUrl::parse("s3://other/a.tpde").unwrap()), None);
        assert_eq!(u.file_name(), "rank-0.tpde");
        assert_eq!(ObjectUrl::parse("s3://b").unwrap().key(), "");
    }

    #[test]
    fn refuses_what_is_not_an_object_url() {
        for bad in ["ckpts/a.tpde", "gs://b/k", "s3:///k", "s3://b/../k", "s3://bad bucket/k"] {
            assert!(ObjectUrl::parse(bad).is_err(), "{bad}");
        }
        let u = ObjectUrl::parse("s3://b/a.tpde").unwrap();
        assert!(u.parent().join("../../x").is_err());
        assert!(ObjectUrl::parse("s3://b").unwrap().path().is_err());
    }
}

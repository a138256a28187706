//! [`ObjectWriter`]: a file uploaded as it is written, that appears only when committed.

use std::io;

use md5::{Digest, Md5};
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt};
use tokio::task::JoinSet;

use crate::{again, block_on, io_error, store, ObjectUrl};

/// How an [`ObjectWriter`] uploads.
#[derive(Clone, Copy, Debug)]
pub struct UploadOptions {
    /// Bytes per part of a multipart upload (S3 asks at least 5 MiB of every part but the
    /// last, and at most 10 000 parts, so the default's largest object is 160 GiB). A file no
    /// larger than one part is sent in one PUT.
    pub part_bytes: usize,
    /// Parts in flight at once: with `part_bytes`, the memory an upload holds.
    pub concurrency: usize,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions { part_bytes: 16 << 20, concurrency: 4 }
    }
}

/// A file being written to object storage: see the crate documentation. Nothing appears
/// under its URL until [`ObjectWriter::commit`]; dropped before that, or after a failed
/// write, it aborts its multipart upload so that the store keeps no parts.
pub struct ObjectWriter {
    url: ObjectUrl,
    store: std::sync::Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    options: UploadOptions,
    /// The bytes not yet sent: the whole file until it outgrows one part, then the part being
    /// filled.
    buffer: Vec<u8>,
    /// The multipart upload, once the file outgrew one part.
    upload: Option<Multipart>,
    written: u64,
    failed: bool,
}

/// A multipart upload in flight. Driven here rather than by `object_store::WriteMultipart`,
/// which aborts inside its `finish` and then reports the abort's error in place of the
/// failure: this one tells a completion whose answer was lost (see [`ObjectWriter::commit`])
/// from a failure, and says whether the abort that follows a failure took.
struct Multipart {
    upload: Box<dyn MultipartUpload>,
    in_flight: JoinSet<object_store::Result<()>>,
    /// The MD5 of every part sent, as the store computes them for the ETag.
    md5s: Vec<[u8; 16]>,
}

impl Multipart {
    /// Sends one part, after waiting until fewer than `concurrency` are in flight.
    async fn send(&mut self, part: Vec<u8>, concurrency: usize) -> object_store::Result<()> {
        while self.in_flight.len() >= concurrency {
            self.join_one().await?;
        }
        self.md5s.push(Md5::digest(&part).into());
        self.in_flight.spawn(self.upload.put_part(part.into()));
        Ok(())
    }

    async fn join_one(&mut self) -> object_store::Result<()> {
        match self.in_flight.join_next().await {
            None => Ok(()),
            Some(Ok(sent)) => sent,
            Some(Err(e)) => Err(object_store::Error::Generic { store: "S3", source: Box::new(e) }),
        }
    }

    /// Aborts the upload, and says how that went, for the error being reported.
    async fn abort(mut self) -> String {
        self.in_flight.shutdown().await;
        match self.upload.abort().await {
            Ok(()) => "its multipart upload was aborted".to_owned(),
            Err(a) => format!(
                "aborting its multipart upload failed too ({a}): the store keeps its parts, unseen, until a \
                 lifecycle rule removes them"
            ),
        }
    }
}

/// The ETag S3 gives a completed multipart object: the hex MD5 of its parts' MD5s, `-`, their
/// count.
fn multipart_etag(md5s: &[[u8; 16]]) -> String {
    let outer: [u8; 16] = Md5::digest(md5s.concat()).into();
    let hex: String = outer.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{}", md5s.len())
}

impl ObjectWriter {
    /// Starts a file that will appear at `url` (replacing any object there) when committed.
    pub fn create(url: &ObjectUrl) -> io::Result<Self> {
        Self::with_options(url, UploadOptions::default())
    }

    /// [`ObjectWriter::create`] with upload settings.
    pub fn with_options(url: &ObjectUrl, options: UploadOptions) -> io::Result<Self> {
        if options.part_bytes == 0 || options.concurrency == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "part size and concurrency must be positive"));
        }
        Ok(ObjectWriter {
            url: url.clone(),
            store: store(url)?,
            path: url.path()?,
            options,
            buffer: Vec::new(),
            upload: None,
            written: 0,
            failed: false,
        })
    }

    /// The URL the file will appear at.
    pub fn url(&self) -> &ObjectUrl {
        &self.url
    }

    /// Completes the upload: the object appears whole under its URL. Returns its length.
    pub fn commit(mut self) -> io::Result<u64> {
        if self.failed {
            return Err(io::Error::other(format!("{}: an earlier write failed; nothing was committed", self.url)));
        }
        let Some(mut upload) = self.upload.take() else {
            let data = std::mem::take(&mut self.buffer);
            block_on(self.store.put(&self.path, data.into())).map_err(|e| io_error(&self.url, e))?;
            return Ok(self.written);
        };
        let (store, path, written) = (&self.store, &self.path, self.written);
        let last = std::mem::take(&mut self.buffer);
        block_on(async move {
            let sent = async {
                if !last.is_empty() {
                    upload.send(last, usize::MAX).await?;
                }
                while !upload.in_flight.is_empty() {
                    upload.join_one().await?;
                }
                upload.upload.complete().await
            };
            let e = match sent.await {
                Ok(_) => return Ok(written),
                Err(e) => e,
            };
            // The completion may have taken with its answer lost (a dropped connection, a 500
            // after the work), and its retry then fails, for the upload is gone: the object is
            // this upload if it has its ETag and length. (Stores that compute ETags otherwise,
            // as under SSE-KMS, never match, and the failure stands.)
            if let Ok(meta) = again(|| store.head(path)).await {
                if meta.size == written
                    && meta.e_tag.is_some_and(|t| t.trim_matches('"') == multipart_etag(&upload.md5s))
                {
                    return Ok(written);
                }
            }
            Err((e, upload.abort().await))
        })
        .map_err(|(e, aborted)| self.failure(e, &aborted))
    }

    fn failure(&self, e: object_store::Error, aborted: &str) -> io::Error {
        let e = io_error(&self.url, e);
        io::Error::new(e.kind(), format!("{e}; nothing was written, {aborted}"))
    }

    /// Sends every full part held, starting the multipart upload when the file outgrows one.
    fn send_full_parts(&mut self) -> object_store::Result<()> {
        let part_bytes = self.options.part_bytes;
        if self.buffer.len() <= part_bytes {
            return Ok(());
        }
        let (store, path, options) = (&self.store, &self.path, self.options);
        let (buffer, upload) = (&mut self.buffer, &mut self.upload);
        block_on(async move {
            if upload.is_none() {
                let started = again(|| store.put_multipart(path)).await?;
                *upload = Some(Multipart { upload: started, in_flight: JoinSet::new(), md5s: Vec::new() });
            }
            let upload = upload.as_mut().expect("started above");
            // Whole parts only, and never the last bytes: commit sends those, as the last part.
            while buffer.len() > part_bytes {
                let rest = buffer.split_off(part_bytes);
                upload.send(std::mem::replace(buffer, rest), options.concurrency).await?;
            }
            Ok(())
        })
    }
}

impl io::Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other(format!("{}: an earlier write failed", self.url)));
        }
        self.buffer.extend_from_slice(buf);
        if let Err(e) = self.send_full_parts() {
            self.failed = true;
            let aborted = match self.upload.take() {
                Some(upload) => block_on(upload.abort()),
                None => "no upload had started".to_owned(),
            };
            return Err(self.failure(e, &aborted));
        }
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            // Best effort: a store keeps the parts of an upload nobody aborts (until a
            // lifecycle rule removes them), but never shows them as an object.
            let _ = block_on(upload.abort());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_multipart_etag_is_the_md5_of_the_parts_md5s() {
        let md5s = [Md5::digest(b"hello").into(), Md5::digest(b"!!").into()];
        // Python: md5(md5(b"hello").digest() + md5(b"!!").digest()).hexdigest() + "-2"
        assert_eq!(multipart_etag(&md5s), "8984feced277842989923057a9c3f0a3-2");
    }
}

//! [`ObjectWriter`]: a file uploaded as it is written, that appears only when committed.

use std::io;
use std::sync::Arc;

use md5::{Digest, Md5};
use object_store::aws::AmazonS3;
use object_store::multipart::{MultipartStore, PartId};
use object_store::{MultipartId, ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use tokio::task::JoinSet;

use crate::{again, block_on, io_error, store, store_with_header, ObjectUrl};

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

/// What an [`ObjectWriter`] expects to replace: its commit takes effect only if the object at
/// its URL is still that one (a conditional request, atomic in the store), so that a writer
/// stopped past its lease never replaces what the writer that took over wrote. See
/// [`crate::version`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is there (no condition).
    Anything,
    /// No object: the commit creates it (`If-None-Match: *`).
    Absent,
    /// The object with this ETag (`If-Match`).
    ETag(String),
}

/// A file being written to object storage: see the crate documentation. Nothing appears
/// under its URL until [`ObjectWriter::commit`]; dropped before that, or after a failed
/// write, it aborts its multipart upload so that the store keeps no parts.
pub struct ObjectWriter {
    url: ObjectUrl,
    store: Arc<AmazonS3>,
    path: object_store::path::Path,
    options: UploadOptions,
    expect: Expect,
    /// The bytes not yet sent: the whole file until it outgrows one part, then the part being
    /// filled.
    buffer: Vec<u8>,
    /// The multipart upload, once the file outgrew one part.
    upload: Option<Multipart>,
    written: u64,
    failed: bool,
}

/// A multipart upload in flight, driven through `object_store`'s `MultipartStore` rather than
/// `WriteMultipart`, which aborts inside its `finish` and then reports the abort's error in
/// place of the failure, and cannot complete conditionally: this one tells a completion whose
/// answer was lost (see [`ObjectWriter::commit`]) from a failure, completes under the writer's
/// [`Expect`], and says whether the abort that follows a failure took.
struct Multipart {
    store: Arc<AmazonS3>,
    path: object_store::path::Path,
    id: MultipartId,
    in_flight: JoinSet<(usize, object_store::Result<PartId>)>,
    /// Each part sent: its id once its upload returned, and its MD5, as the store computes
    /// them for the ETag.
    parts: Vec<(Option<PartId>, [u8; 16])>,
}

impl Multipart {
    /// Sends one part, after waiting until fewer than `concurrency` are in flight.
    async fn send(&mut self, part: Vec<u8>, concurrency: usize) -> object_store::Result<()> {
        while self.in_flight.len() >= concurrency {
            self.join_one().await?;
        }
        let index = self.parts.len();
        self.parts.push((None, Md5::digest(&part).into()));
        let (store, path, id) = (self.store.clone(), self.path.clone(), self.id.clone());
        self.in_flight.spawn(async move { (index, store.put_part(&path, &id, index, part.into()).await) });
        Ok(())
    }

    async fn join_one(&mut self) -> object_store::Result<()> {
        match self.in_flight.join_next().await {
            None => Ok(()),
            Some(Ok((index, sent))) => {
                self.parts[index].0 = Some(sent?);
                Ok(())
            }
            Some(Err(e)) => Err(object_store::Error::Generic { store: "S3", source: Box::new(e) }),
        }
    }

    /// Waits for every part, then completes the upload through `completing` (a client that
    /// sends the writer's precondition).
    async fn complete(&mut self, completing: &AmazonS3) -> object_store::Result<()> {
        while !self.in_flight.is_empty() {
            self.join_one().await?;
        }
        let ids = self.parts.iter().map(|p| p.0.clone().expect("every part returned")).collect();
        completing.complete_multipart(&self.path, &self.id, ids).await.map(|_| ())
    }

    fn etag(&self) -> String {
        multipart_etag(&self.parts.iter().map(|p| p.1).collect::<Vec<_>>())
    }

    /// Aborts the upload, and says how that went, for the error being reported.
    async fn abort(mut self) -> String {
        self.in_flight.shutdown().await;
        match self.store.abort_multipart(&self.path, &self.id).await {
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
    format!("{}-{}", hex(&outer), md5s.len())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether an error is a store's refusal of a request's precondition.
fn refused(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. })
}

impl ObjectWriter {
    /// Starts a file that will appear at `url` (replacing any object there) when committed.
    pub fn create(url: &ObjectUrl) -> io::Result<Self> {
        Self::with_options(url, UploadOptions::default(), Expect::Anything)
    }

    /// [`ObjectWriter::create`] for a file that appears only if the object at `url` is still
    /// what `expect` says when it is committed; otherwise the commit fails, writing nothing.
    pub fn create_expecting(url: &ObjectUrl, expect: Expect) -> io::Result<Self> {
        Self::with_options(url, UploadOptions::default(), expect)
    }

    /// [`ObjectWriter::create_expecting`] with upload settings.
    pub fn with_options(url: &ObjectUrl, options: UploadOptions, expect: Expect) -> io::Result<Self> {
        if options.part_bytes == 0 || options.concurrency == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "part size and concurrency must be positive"));
        }
        Ok(ObjectWriter {
            url: url.clone(),
            store: store(url)?,
            path: url.path()?,
            options,
            expect,
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
        let (store, path, written) = (self.store.clone(), self.path.clone(), self.written);
        let Some(mut upload) = self.upload.take() else {
            let data = std::mem::take(&mut self.buffer);
            let etag = hex(&Into::<[u8; 16]>::into(Md5::digest(&data)));
            let mode = match &self.expect {
                Expect::Anything => PutMode::Overwrite,
                Expect::Absent => PutMode::Create,
                Expect::ETag(e) => PutMode::Update(UpdateVersion { e_tag: Some(e.clone()), version: None }),
            };
            let opts = PutOptions { mode, ..Default::default() };
            return match block_on(store.put_opts(&path, data.into(), opts)) {
                Ok(_) => Ok(written),
                // A conditional PUT retried after its answer was lost finds its own object.
                Err(e) if refused(&e) && block_on(self.holds(&etag)) => Ok(written),
                Err(e) => Err(self.failure(e, "no upload had started")),
            };
        };
        let last = std::mem::take(&mut self.buffer);
        let completing = match &self.expect {
            Expect::Anything => None,
            Expect::Absent => Some(store_with_header(&self.url, http::header::IF_NONE_MATCH, "*")?),
            Expect::ETag(e) => Some(store_with_header(&self.url, http::header::IF_MATCH, e)?),
        };
        let outcome = block_on(async {
            let sent = async {
                if !last.is_empty() {
                    upload.send(last, usize::MAX).await?;
                }
                upload.complete(completing.as_ref().unwrap_or(&store)).await
            };
            let e = match sent.await {
                Ok(()) => return Ok(written),
                Err(e) => e,
            };
            // The completion may have taken with its answer lost (a dropped connection, a 500
            // after the work), and its retry then fails, for the upload is gone (or its
            // precondition no longer holds): the object is this upload if it has its ETag and
            // length. (Stores that compute ETags otherwise, as under SSE-KMS, never match, and
            // the failure stands.)
            if self.holds(&upload.etag()).await {
                return Ok(written);
            }
            Err((e, upload.abort().await))
        });
        outcome.map_err(|(e, aborted)| self.failure(e, &aborted))
    }

    /// Whether the object at the URL is this writer's: its ETag and length.
    async fn holds(&self, etag: &str) -> bool {
        match again(|| self.store.head(&self.path)).await {
            Ok(meta) => meta.size == self.written && meta.e_tag.is_some_and(|t| t.trim_matches('"') == etag),
            Err(_) => false,
        }
    }

    fn failure(&self, e: object_store::Error, aborted: &str) -> io::Error {
        if refused(&e) {
            return io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: another writer replaced this object while this one was writing it (this writer was \
                     stopped or cut off past its lease?); nothing was written, {aborted}",
                    self.url
                ),
            );
        }
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
                let id = again(|| store.create_multipart(path)).await?;
                *upload = Some(Multipart {
                    store: store.clone(),
                    path: path.clone(),
                    id,
                    in_flight: JoinSet::new(),
                    parts: Vec::new(),
                });
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
        let md5s: [[u8; 16]; 2] = [Md5::digest(b"hello").into(), Md5::digest(b"!!").into()];
        // Python: md5(md5(b"hello").digest() + md5(b"!!").digest()).hexdigest() + "-2"
        assert_eq!(multipart_etag(&md5s), "8984feced277842989923057a9c3f0a3-2");
    }
}

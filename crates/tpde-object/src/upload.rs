//! [`ObjectWriter`]: a file uploaded as it is written, that appears only when committed.

use std::io;

use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

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
    /// The bytes written before the first part filled up.
    first: Vec<u8>,
    /// The multipart upload, once the file outgrew one part.
    upload: Option<WriteMultipart>,
    written: u64,
    failed: bool,
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
            first: Vec::new(),
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
        let result = match self.upload.take() {
            // finish() aborts the upload itself when completing it fails.
            Some(upload) => block_on(upload.finish()).map(|_| ()),
            None => block_on(self.store.put(&self.path, std::mem::take(&mut self.first).into())).map(|_| ()),
        };
        result.map_err(|e| io_error(&self.url, e))?;
        Ok(self.written)
    }

    /// Starts the multipart upload with the bytes held so far.
    fn start_upload(&mut self) -> object_store::Result<()> {
        let first = std::mem::take(&mut self.first);
        let (store, path, options) = (&self.store, &self.path, self.options);
        let upload = block_on(async move {
            let mut upload =
                WriteMultipart::new_with_chunk_size(again(|| store.put_multipart(path)).await?, options.part_bytes);
            upload.write(&first);
            Ok::<_, object_store::Error>(upload)
        })?;
        self.upload = Some(upload);
        Ok(())
    }

    fn write_inner(&mut self, buf: &[u8]) -> object_store::Result<()> {
        match &mut self.upload {
            None => {
                self.first.extend_from_slice(buf);
                if self.first.len() > self.options.part_bytes {
                    self.start_upload()?;
                }
                Ok(())
            }
            Some(upload) => {
                let concurrency = self.options.concurrency;
                // Inside the runtime: write() spawns the upload of each part that fills up.
                block_on(async {
                    upload.write(buf);
                    upload.wait_for_capacity(concurrency).await
                })
            }
        }
    }
}

impl io::Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other(format!("{}: an earlier write failed", self.url)));
        }
        if let Err(e) = self.write_inner(buf) {
            self.failed = true;
            if let Some(upload) = self.upload.take() {
                let _ = block_on(upload.abort());
            }
            return Err(io_error(&self.url, e));
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

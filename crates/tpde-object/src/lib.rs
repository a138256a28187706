//! TPDE files in object storage: S3 and every store that speaks its API, through the Arrow
//! project's `object_store` crate.
//!
//! - [`ObjectSource`] is a [`tpde_read::Source`] over one object: opening it is one ranged GET
//!   of the object's start (the header, and the object's length) and, for an object larger
//!   than that, one of its tail (the trailer and, when it fits, the directory); the reader's
//!   [`tpde_read::Source::prefetch`] then gets a window of chunks at a time, neighbours coalesced
//!   and independent ranges concurrently.
//! - [`ObjectWriter`] is an [`std::io::Write`] that uploads as it is written (a multipart upload
//!   once the bytes outgrow one part, one PUT otherwise), so a file larger than memory goes
//!   straight to the bucket; the object appears only on [`ObjectWriter::commit`], and an
//!   upload dropped or failed before that is aborted.
//!
//! Objects are named by URL, `s3://bucket/key` ([`ObjectUrl`]). The connection is configured
//! by the variables AWS's own tools read (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`,
//! `AWS_CHECKSUM_ALGORITHM`, ...). Requests that fail for a passing reason (a dropped
//! connection, a 5xx answer) are retried with backoff; reads also resume a body cut short.
//! Errors are [`std::io::Error`]s whose message starts with the object's URL; a missing object
//! is [`std::io::ErrorKind::NotFound`].
//!
//! The store's API is async; this crate runs it on one small runtime of its own and blocks the
//! calling thread, so that the reader and the writer, which are synchronous, need not change.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod source;
mod upload;
mod url;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};

pub use source::{ObjectSource, Stats};
pub use upload::{Expect, ObjectWriter, UploadOptions};
pub use url::ObjectUrl;

/// The runtime every request of this process runs on, started on first use.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tpde-object")
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    })
}

/// Runs `f` to completion on the runtime, from a thread that is not one of its own.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// How often and how long a request that failed for a passing reason (a dropped connection, a
/// 5xx or `SlowDown` answer) is tried again: exponential backoff with jitter from 100 ms,
/// doubling up to 20 s a wait, for at most `AWS_MAX_ATTEMPTS` attempts (default 10, as the
/// variable means to AWS's SDKs) and `TPDE_S3_RETRY_SECONDS` seconds in all (default 180). A
/// store throttling for a few seconds is waited out rather than failing a save.
pub fn retry_config() -> RetryConfig {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
    let attempts = var("AWS_MAX_ATTEMPTS").filter(|&a| a >= 1).unwrap_or(10);
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(20),
            base: 2.0,
        },
        max_retries: (attempts - 1) as usize,
        retry_timeout: Duration::from_secs(var("TPDE_S3_RETRY_SECONDS").unwrap_or(180)),
    }
}

/// Runs `request` again when it fails in a way `object_store`'s own retries do not cover: a
/// response whose body broke off (a listing cut short), for requests that are safe to repeat
/// (list, delete, head, starting a multipart upload). Three more tries, 0.5, 1 and 2 s apart.
async fn again<T, F, Fut>(mut request: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    let mut wait = Duration::from_millis(500);
    for _ in 0..3 {
        match request().await {
            Err(object_store::Error::Generic { .. }) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            done => return done,
        }
    }
    request().await
}

/// Whether the environment configures object storage: an endpoint or credentials of AWS's
/// own variables. Without them a client would look for credentials on the cloud's metadata
/// endpoint, so a reader follows a URL it meets in a file only when this holds or the user
/// opened a URL (spec §7.3).
pub fn configured() -> bool {
    const VARS: [&str; 6] = [
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT",
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ];
    VARS.iter().any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

/// The client for `bucket`, built once per bucket and process from the environment, so that
/// its connections are reused.
fn store(url: &ObjectUrl) -> io::Result<Arc<AmazonS3>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<AmazonS3>>>> = OnceLock::new();
    let stores = STORES.get_or_init(Default::default);
    let mut stores = stores.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = stores.get(url.bucket()) {
        return Ok(s.clone());
    }
    let s3 = Arc::new(build(url, ClientOptions::new())?);
    stores.insert(url.bucket().to_owned(), s3.clone());
    Ok(s3)
}

/// A client for `url`'s bucket configured by the environment (as `AmazonS3Builder::from_env`
/// reads it), on top of `options`: `from_env`'s own client options would be replaced whole by
/// `with_client_options`, so the variables are applied after them.
fn build(url: &ObjectUrl, options: ClientOptions) -> io::Result<AmazonS3> {
    // HTTPS through rustls with ring (see Cargo.toml); a provider the process installed first
    // (another library's) is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::new().with_client_options(options);
    for (key, value) in std::env::vars() {
        if let (true, Ok(key)) = (key.starts_with("AWS_"), key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()) {
            builder = builder.with_config(key, value);
        }
    }
    // Conditional PUTs (If-None-Match, If-Match) as S3, MinIO and R2 answer them: what
    // `put_new`'s writer lease and [`Expect`] need.
    builder
        .with_bucket_name(url.bucket())
        .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
        .with_retry(retry_config())
        .build()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))
}

/// A client whose every request carries `header`: `object_store` sends no precondition with a
/// multipart upload's completion, so [`ObjectWriter`] completes a conditional one through a
/// client of its own that adds it (S3, MinIO and s3s answer `If-Match` and `If-None-Match` on
/// `CompleteMultipartUpload`).
fn store_with_header(url: &ObjectUrl, name: http::HeaderName, value: &str) -> io::Result<AmazonS3> {
    let value = http::HeaderValue::from_str(value).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{url}: ETag {value:?} is not a header value"))
    })?;
    build(url, ClientOptions::new().with_default_headers(http::HeaderMap::from_iter([(name, value)])))
}

/// The version of the object at `url` that a writer means to replace: its ETag, or
/// [`Expect::Absent`] if there is none. Taken *before* the writer checks that it still may write
/// there (its lease), and given to [`ObjectWriter::create_expecting`], it makes the write complete
/// only if no other writer replaced the object in between: a writer stopped past its lease can
/// then never replace what the writer that took over wrote.
pub fn version(url: &ObjectUrl) -> io::Result<Expect> {
    let store = store(url)?;
    let path = url.path()?;
    match block_on(again(|| store.head(&path))) {
        Ok(meta) => Ok(meta.e_tag.map_or(Expect::Anything, Expect::ETag)),
        Err(object_store::Error::NotFound { .. }) => Ok(Expect::Absent),
        Err(e) => Err(io_error(url, e)),
    }
}

/// An `object_store` error as an I/O error that names the object.
fn io_error(url: &ObjectUrl, e: object_store::Error) -> io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
            io::ErrorKind::InvalidData
        }
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{url}: {e}"))
}

/// The size of the object at `url`, or `None` if there is none.
pub fn size(url: &ObjectUrl) -> io::Result<Option<u64>> {
    let store = store(url)?;
    let path = url.path()?;
    match block_on(again(|| store.head(&path))) {
        Ok(meta) => Ok(Some(meta.size)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(io_error(url, e)),
    }
}

/// Deletes the object at `url` (deleting a missing object is not an error, as in S3).
pub fn delete(url: &ObjectUrl) -> io::Result<()> {
    let store = store(url)?;
    let path = url.path()?;
    match block_on(again(|| store.delete(&path))) {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(io_error(url, e)),
    }
}

/// The objects under the "folder" `url` (its key and a `/`; the whole bucket for an empty
/// key), recursively: each one's key relative to that folder and its size, sorted by key.
pub fn list(url: &ObjectUrl) -> io::Result<Vec<(String, u64)>> {
    let store = store(url)?;
    let prefix = url.path_or_root()?;
    let base = if url.key().is_empty() { String::new() } else { format!("{}/", url.key()) };
    let metas: Vec<object_store::ObjectMeta> =
        block_on(again(|| store.list(prefix.as_ref()).try_collect())).map_err(|e| io_error(url, e))?;
    let mut out: Vec<(String, u64)> = metas
        .into_iter()
        .filter_map(|m| m.location.as_ref().strip_prefix(&base).map(|rel| (rel.to_owned(), m.size)))
        .collect();
    out.sort();
    Ok(out)
}

/// The whole object at `url`, in one streamed GET (what `aws s3 cp` does for a download).
pub fn get_all(url: &ObjectUrl) -> io::Result<bytes::Bytes> {
    let store = store(url)?;
    let path = url.path()?;
    block_on(async { store.get(&path).await?.bytes().await }).map_err(|e| io_error(url, e))
}

/// Writes `data` to `url` in one PUT only if no object is there (`If-None-Match: *`, atomic
/// in the store): `true` if this call created it, `false` if one was there already.
pub fn put_new(url: &ObjectUrl, data: Vec<u8>) -> io::Result<bool> {
    let store = store(url)?;
    let path = url.path()?;
    let opts = object_store::PutOptions { mode: object_store::PutMode::Create, ..Default::default() };
    match block_on(store.put_opts(&path, data.into(), opts)) {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(io_error(url, e)),
    }
}

/// Writes `data` to `url` in one PUT (the object appears whole or not at all).
pub fn put(url: &ObjectUrl, data: Vec<u8>) -> io::Result<()> {
    let store = store(url)?;
    let path = url.path()?;
    block_on(store.put(&path, data.into())).map(|_| ()).map_err(|e| io_error(url, e))
}

//! The TPDE writer. [`Writer`] streams a file to any [`std::io::Write`]: the header first,
//! then each tensor's chunks as they are encoded, then the directory and the trailer in
//! [`Writer::finish`]. Nothing but the directory is held in memory between tensors, so the
//! number and size of tensors need not be known in advance.
//!
//! [`FileWriter`] writes to a temporary file beside the destination and renames it into place
//! only when the trailer is written and synced: a crash or an error never leaves a partial
//! file under the final name.
//!
//! ```
//! use tpde_write::{Writer, WriteOptions};
//! use tpde_format::{DType, MetadataValue};
//! let mut w = Writer::new(Vec::new(), WriteOptions::default())?;
//! w.add_metadata("tpde.step", MetadataValue::U64(100))?;
//! let weights: Vec<u8> = [1.0f32, -2.0, 0.5].iter().flat_map(|x| x.to_le_bytes()).collect();
//! w.add_tensor("layer.0.weight", DType::F32, &[3], &weights)?;
//! let file: Vec<u8> = w.finish()?;
//! assert_eq!(&file[..5], b"\x89TPDE");
//! # Ok::<(), tpde_write::WriteError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod atomic;
mod error;
pub mod lossy;
mod options;
mod pipeline;
mod writer;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rayon::prelude::*;
use tpde_codec::predicted::Inputs;
use tpde_codec::{ChunkContext, CodecError, Encoder, Predicted, Records};
use tpde_format::digest::{tensor_digest, Digest};
use tpde_format::limits::{
    MAX_CHUNK_DECODED_LEN, MAX_KEY_LEN, MAX_NAME_LEN, MAX_PATH_HINT_LEN, MAX_RANK, MIN_ALIGNMENT,
};
use tpde_format::metadata::reserved_type;
use tpde_format::CodecTag;
use tpde_format::{
    BaseRef, ChunkEntry, DType, Directory, ErrorKind, Header, MetadataEntry, MetadataValue, Prediction,
    RequiredFeatures, TensorEntry, Trailer,
};

pub use atomic::{AtomicFile, AtomicFolder};
pub use error::WriteError;
pub use options::{PredictInput, TensorInput, WriteOptions, DEFAULT_CHUNK_BYTES};
use pipeline::*;
pub use writer::{files_frame, FileWriter, Writer};

//! Limits a reader enforces (spec §8). A file over any of them is rejected with
//! [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded), before anything is allocated
//! from the value.

/// Longest tensor name, in bytes of UTF-8.
pub const MAX_NAME_LEN: u64 = 4096;
/// Longest metadata key, in bytes of UTF-8.
pub const MAX_KEY_LEN: u64 = 1024;
/// Longest base path hint, in bytes of UTF-8.
pub const MAX_PATH_HINT_LEN: u64 = 4096;
/// Highest tensor rank.
pub const MAX_RANK: u64 = 32;
/// Largest directory, in bytes.
pub const MAX_DIRECTORY_LEN: u64 = 256 << 20;
/// Largest decoded chunk, in bytes.
pub const MAX_CHUNK_DECODED_LEN: u64 = 1 << 30;
/// Largest stored chunk, in bytes (a little over the decoded limit: a codec may expand).
pub const MAX_CHUNK_STORED_LEN: u64 = (1 << 30) + (1 << 20);
/// Longest codec parameter block, in bytes.
pub const MAX_CODEC_PARAMS_LEN: u64 = 1024;
/// Largest payload alignment, in bytes.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Smallest payload alignment, in bytes.
pub const MIN_ALIGNMENT: u64 = 64;
/// The longest chain of predicted tensors that read each other (a weight reads its second
/// moment, itself predicted from its first moment: 2).
pub const MAX_PREDICTION_DEPTH: usize = 4;

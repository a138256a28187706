//! Opening a file: mapping it, reading and validating its header, trailer and directory (all of
//! spec §9 that a file can be judged by before any chunk is decoded), and attaching a base.

use super::*;

impl Reader<memmap2::Mmap> {
    /// Maps the file at `path` and reads its header, trailer and directory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        Self::open_with(path, ReadOptions::default())
    }

    /// [`Reader::open`] with settings.
    pub fn open_with(path: impl AsRef<Path>, options: ReadOptions) -> Result<Self, ReadError> {
        let path = path.as_ref();
        let io = |source| ReadError::Io { path: path.to_path_buf(), source };
        let map = map_file(path).map_err(io)?;
        Reader::with_options(map, options)
    }
}

/// Maps a file read-only (the reader's one `unsafe`: memmap2's map, whose contract is below).
pub fn map_file(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = File::open(path)?;
    // A folder opens, then fails to map with "No such device": say what it is instead.
    if file.metadata()?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "a folder, not a file (a .tpde file is wanted here)",
        ));
    }
    // SAFETY: the map is read-only. Like every mmap reader (safetensors, object), it relies on
    // no other process truncating or rewriting the file while it is mapped; TPDE files are
    // written once, to a temporary name, then renamed into place, so they are not rewritten.
    #[allow(unsafe_code)]
    unsafe {
        memmap2::Mmap::map(&file)
    }
}

impl<S: Source> Reader<S> {
    /// Reads the header, trailer and directory of `src`.
    pub fn from_source(src: S) -> Result<Self, ReadError> {
        Self::with_options(src, ReadOptions::default())
    }

    /// [`Reader::from_source`] with settings.
    pub fn with_options(src: S, options: ReadOptions) -> Result<Self, ReadError> {
        let len = src.len();
        let head = bytes(&src, 0..len.min(Header::LEN as u64), "header")?;
        let header = Header::parse(&head, len)?;
        let min_len = (Header::LEN + Trailer::LEN) as u64;
        if len < min_len {
            return Err(FormatError::Truncated {
                what: "trailer",
                start: Header::LEN as u64,
                end: min_len,
                file_len: len,
            }
            .into());
        }
        let tail: [u8; 32] = bytes(&src, len - Trailer::LEN as u64..len, "trailer")?
            .as_ref()
            .try_into()
            .expect("bytes() returns the length asked for");
        let trailer = Trailer::parse(&tail, len)?;
        let dir_at = trailer.directory_offset;
        let dir_bytes = bytes(&src, dir_at..dir_at + trailer.directory_length, "directory")?;
        let crc = crc32fast::hash(&dir_bytes);
        if crc != trailer.directory_crc32 {
            return Err(FormatError::ChecksumMismatch {
                what: "directory",
                location: Position::at(dir_at),
                stored: format!("{:08x}", trailer.directory_crc32),
                computed: format!("{crc:08x}"),
            }
            .into());
        }
        // Errors past the header of a file newer than this reader say that it is newer.
        let newer = |e: ReadError| e.in_file_of_minor(header.minor_version);
        let directory = Directory::parse(&dir_bytes).map_err(|e| newer(e.offset_by(dir_at).into()))?;
        validate(&header, &directory, dir_at).map_err(|e| newer(e.into()))?;
        for t in &directory.tensors {
            for (i, c) in t.chunks.iter().enumerate() {
                tpde_codec::decoder(c.codec)
                    .check_lengths(c.stored_length, c.decoded_length)
                    .map_err(|source| newer(ReadError::Codec { location: chunk_location(t, i, c), source }))?;
            }
        }
        let index = directory.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let predicted_inputs: HashSet<String> = predictions(&directory)
            .flat_map(|p| p.inputs().into_iter().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        Ok(Reader {
            src,
            header,
            trailer,
            directory,
            index,
            options,
            base: None,
            predicted_inputs: predicted_inputs.into(),
            inputs: InputCache::default(),
        })
    }

    /// Attaches the base this delta file was written against (spec §6.3). Fails, naming both
    /// digests, if the base's content digest is not the one the file records.
    pub fn with_base(mut self, base: Arc<dyn Base>) -> Result<Self, ReadError> {
        let Some(want) = &self.directory.base else {
            return Err(ReadError::NotADelta);
        };
        let found = base.content_digest()?;
        if found != want.digest {
            return Err(ReadError::BaseMismatch { expected: to_hex(&want.digest), found: to_hex(&found) });
        }
        // In a chain the base's chunks that this file's predictions read are read again by the
        // file above it as the base tensors themselves: kept, not decoded once per reader.
        let predictions: Vec<Prediction> = predictions(&self.directory).collect();
        base.keep_decoded(&predictions.iter().flat_map(Prediction::base_inputs).collect::<Vec<_>>());
        self.base = Some(base);
        Ok(self)
    }
}

/// The predictions of a file's `delta-predicted` chunks (spec §6.8), as validated at open (R30).
fn predictions(directory: &Directory) -> impl Iterator<Item = Prediction> + '_ {
    (directory.tensors.iter().flat_map(|t| &t.chunks))
        .filter(|c| c.codec == CodecTag::DeltaPredicted)
        .filter_map(|c| Prediction::parse(&c.params).ok())
}

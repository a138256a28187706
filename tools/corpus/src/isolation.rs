//! The corpus's isolation rule (conformance/README.md): an invalid file breaks exactly one
//! condition of its rule, or several whose order spec §9's P1–P9 fix. Checked here for the
//! file table's paths (§5.5), the sparse plane records built by hand (§6.2.5) and the block
//! records (§6.2.6), each condition written out again, apart from the reference's `check_path`,
//! `sparse::parse` and block decoders, so that the check does not inherit their bugs.

use tpde_format::{CodecTag, DType, Directory};

/// The conditions of §5.5 that `path` breaks, by name, in the order P9 fixes.
pub fn broken_path_conditions(path: &[u8]) -> Vec<&'static str> {
    let mut broken = Vec::new();
    if path.len() > 1024 {
        broken.push("path over 1024 bytes");
    }
    let Ok(text) = std::str::from_utf8(path) else {
        broken.push("not UTF-8");
        return broken;
    };
    let components: Vec<&str> = text.split('/').collect();
    if components.iter().any(|c| c.len() > 255) {
        broken.push("component over 255 bytes");
    }
    if text.is_empty() {
        broken.push("empty");
        return broken;
    }
    if text.contains('\\') {
        broken.push("holds \\");
    }
    if text.contains(':') {
        broken.push("holds :");
    }
    if text.chars().any(|c| (c as u32) < 0x20 || (0x7F..=0x9F).contains(&(c as u32))) {
        broken.push("holds a control character");
    }
    if components.iter().any(|c| c.is_empty()) {
        broken.push("an empty component");
    }
    if components.iter().any(|c| *c == "." || *c == "..") {
        broken.push("a . or .. component");
    }
    let last = components.last().expect("split gives one").to_ascii_lowercase();
    let last = last.strip_suffix(".index.json").unwrap_or(&last);
    let weights = ["safetensors", "bin", "pt", "pth", "ckpt", "h5", "msgpack", "gguf", "onnx"];
    if last.rsplit_once('.').is_some_and(|(_, ext)| weights.contains(&ext)) {
        broken.push("names weights");
    }
    broken
}

/// Panics unless an invalid file's path breaks no condition (the file breaks another rule) or
/// exactly one, or the ones P9 orders (`ordered`: a limit before the value it bounds, listed
/// with the file).
pub fn assert_isolated_path(file: &str, path: &[u8], ordered: &[&str]) {
    let broken = broken_path_conditions(path);
    let isolated = broken.len() <= 1 || (!ordered.is_empty() && broken == ordered);
    assert!(isolated, "{file}: its path breaks {broken:?}, not exactly one condition of §5.5");
}

/// A sparse plane record (§6.2.5) before it is coded (`sparse::record` codes it).
#[derive(Clone, Debug)]
pub struct SparseParts {
    /// The tag of the chunk that holds it.
    pub tag: CodecTag,
    /// The plane's length.
    pub n: usize,
    pub fill: u8,
    pub positions: Vec<u32>,
    /// The listed bytes, one per position.
    pub values: Vec<u8>,
    /// The coder byte (2 codes the positions as packed).
    pub coder: u8,
    /// The mode of the listed bytes' record.
    pub values_mode: u8,
    /// Mode 0x02's lane count, if not the writer's.
    pub lanes: Option<u32>,
}

/// The conditions of §6.2.5 that a sparse record breaks, by name. Its coded bytes follow the
/// coders' rules by construction (padding, lengths, end states), so these are the rest.
pub fn broken_sparse_conditions(p: &SparseParts) -> Vec<&'static str> {
    let m = p.positions.len();
    let mut broken = Vec::new();
    let allows = [0x000E, 0x000F, 0x0010];
    if !allows.contains(&p.tag.to_u16()) {
        broken.push("a tag that allows mode 0x05");
    }
    if m > p.n {
        broken.push("m at most n");
    }
    if p.coder > 1 {
        broken.push("coder is 0 or 1");
    }
    if p.positions.windows(2).any(|w| w[0] >= w[1]) {
        broken.push("positions increasing");
    }
    if p.positions.iter().any(|&q| q as usize >= p.n) {
        broken.push("positions below n");
    }
    if p.values_mode != 0 && p.values_mode != 2 {
        broken.push("values of mode 0x00 or 0x02");
    }
    if p.values_mode == 2 && p.lanes.is_some_and(|l| l < 1 || l as usize > m.div_ceil(4).max(1)) {
        broken.push("values' lanes at most max(1, ⌈m/4⌉)");
    }
    if p.values.contains(&p.fill) {
        broken.push("value is not the fill");
    }
    broken
}

/// Panics unless a sparse record breaks exactly `condition`, or nothing for a valid file.
pub fn assert_isolated_sparse(file: &str, p: &SparseParts, condition: Option<&str>) {
    assert_eq!(p.positions.len(), p.values.len(), "{file}: a value per position");
    let broken = broken_sparse_conditions(p);
    let want: Vec<&str> = condition.into_iter().collect();
    assert_eq!(broken, want, "{file}: its sparse record breaks {broken:?}, not exactly {want:?} (§6.2.5)");
}

/// The conditions of §6.2.6 that a block record of `n` symbols with frequencies `freq` breaks,
/// by name: `bytes` from its `end[]` on, through its chunk's end (`in_chunk` bytes) and beyond
/// it in the file, so that a word past the chunk decodes as a reader without that check would
/// read it. Decoded from the text, apart from the reference's decoders.
pub fn broken_block_conditions(freq: &[u16; 256], bytes: &[u8], in_chunk: usize, n: usize) -> Vec<&'static str> {
    let k = n.div_ceil(16_384).max(1);
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("the index is there"));
    let ends: Vec<usize> = (0..k).map(|b| u32_at(4 * b) as usize).collect();
    let words_at = 4 * k + 128 * k;
    let word =
        |p: usize| bytes.get(words_at + 2 * p..words_at + 2 * p + 2).map(|w| u32::from(w[0]) | u32::from(w[1]) << 8);
    let mut start = [0u32; 256];
    for s in 1..256 {
        start[s] = start[s - 1] + u32::from(freq[s - 1]);
    }
    let mut broken = Vec::new();
    if (0..32 * k).any(|i| u32_at(4 * k + 4 * i) < 1 << 16) {
        broken.push("an initial state below 2^16");
    }
    if ends.windows(2).any(|e| e[1] < e[0]) {
        broken.push("an end that decreases");
    }
    if words_at + 2 * ends[k - 1] > in_chunk {
        broken.push("words past the chunk");
    }
    let (mut out, mut left, mut finals) = (false, false, false);
    for b in 0..k {
        let mut x: Vec<u32> = (0..32).map(|j| u32_at(4 * k + 4 * (32 * b + j))).collect();
        let (mut p, end) = (if b == 0 { 0 } else { ends[b - 1] }, ends[b]);
        let count = (n - 16_384 * b).min(16_384);
        'steps: for i in 0..count {
            let j = i % 32;
            let slot = x[j] % 4096;
            let s = (0..256).find(|&s| start[s] <= slot && slot < start[s] + u32::from(freq[s])).expect("a full table");
            x[j] = u32::from(freq[s]) * (x[j] / 4096) + slot - start[s];
            if x[j] < 1 << 16 {
                match word(p).filter(|_| p < end) {
                    Some(w) => x[j] = x[j] << 16 | w,
                    None => {
                        out = true;
                        break 'steps;
                    }
                }
                p += 1;
            }
            if i + 1 == count {
                left |= p < end;
                finals |= x.iter().any(|&x| x != 1 << 16);
            }
        }
    }
    for (broke, name) in
        [(out, "a block out of words"), (left, "words left over"), (finals, "a final state other than 2^16")]
    {
        if broke {
            broken.push(name);
        }
    }
    broken
}

/// A `delta-predicted` chunk's params as §6.8 gives them: the predictor and its names, or None
/// where they are not a prediction (an unknown predictor, a name empty, not UTF-8 or cut
/// short, bytes after the last name).
fn prediction_params(params: &[u8]) -> Option<(u8, Vec<&str>)> {
    let (&predictor, rest) = params.split_first()?;
    let (constants, names) = match predictor {
        1 | 3 => (3, 1),
        2 | 4 => (4, 2),
        _ => return None,
    };
    let mut at = 4 * constants;
    let mut read = Vec::new();
    for _ in 0..names {
        let len = usize::from(u16::from_le_bytes(rest.get(at..at + 2)?.try_into().ok()?));
        let name = std::str::from_utf8(rest.get(at + 2..at + 2 + len)?).ok().filter(|n| !n.is_empty())?;
        read.push(name);
        at += 2 + len;
    }
    (at == rest.len()).then_some((predictor, read))
}

/// The conditions of §6.8 that a file's predictions break (R30, and R29 for what they read
/// from the base), by name, from its directory and its base's, written out again apart from
/// the reference's `Prediction::parse` and `validate_predictions`.
pub fn broken_prediction_conditions(file: &Directory, base: Option<&Directory>) -> Vec<&'static str> {
    let mut broken = Vec::new();
    let mut note = |c: &'static str| {
        if !broken.contains(&c) {
            broken.push(c);
        }
    };
    let find = |d: &Directory, name: &str| d.tensors.iter().position(|t| t.name == name);
    // Edges of the prediction graph: tensor i reads tensor j of this file.
    let mut reads = vec![Vec::new(); file.tensors.len()];
    for (i, t) in file.tensors.iter().enumerate() {
        for c in t.chunks.iter().filter(|c| c.codec == CodecTag::DeltaPredicted) {
            let Some((predictor, names)) = prediction_params(&c.params) else {
                note("params a prediction");
                continue;
            };
            if t.dtype != DType::F32 {
                note("the tensor f32");
            }
            let of_t = |d: &Directory, j: usize| d.tensors[j].dtype == DType::F32 && d.tensors[j].shape == t.shape;
            if predictor != 4 {
                for name in &names {
                    match find(file, name) {
                        None => note("a name of the file"),
                        Some(j) if !of_t(file, j) => note("a file input f32 of the tensor's shape"),
                        Some(j) if !reads[i].contains(&j) => reads[i].push(j),
                        Some(_) => {}
                    }
                }
            }
            if let Some(b) = base {
                match find(b, &t.name) {
                    None => note("its base tensor there"),
                    Some(j) if b.tensors[j].dtype != t.dtype || b.tensors[j].shape != t.shape => {
                        note("its base tensor of its dtype and shape")
                    }
                    Some(_) => {}
                }
                let from_base: &[&str] = match predictor {
                    1 | 3 => &names[..1],
                    4 => &names,
                    _ => &[],
                };
                for name in from_base {
                    match find(b, name) {
                        None => note("a base input there"),
                        Some(j) if !of_t(b, j) => note("a base input f32 of the tensor's shape"),
                        Some(_) => {}
                    }
                }
            }
        }
    }
    // Loops, then the longest path in tensors that read another (a tensor that reads none ends
    // a path uncounted), by repeated relaxation: at most as many rounds as tensors.
    let mut height = vec![0usize; reads.len()];
    for _ in 0..=reads.len() {
        let next: Vec<usize> = (0..reads.len())
            .map(|i| if reads[i].is_empty() { 0 } else { 1 + reads[i].iter().map(|&j| height[j]).max().unwrap_or(0) })
            .collect();
        if next == height {
            break;
        }
        height = next;
    }
    if height.iter().any(|&h| h > reads.len()) {
        note("no loop");
    } else if height.iter().any(|&h| h > 4) {
        note("a chain of at most 4");
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_named_one_by_one() {
        assert!(broken_path_conditions(b"config.json").is_empty());
        assert_eq!(broken_path_conditions(b"a/"), ["an empty component"]);
        assert_eq!(broken_path_conditions(b"C:x"), ["holds :"]);
        assert_eq!(broken_path_conditions("a\u{85}".as_bytes()), ["holds a control character"]);
        assert_eq!(broken_path_conditions(&[b'a'; 1025]), ["path over 1024 bytes", "component over 255 bytes"]);
        assert_eq!(broken_path_conditions(b"/x.bin"), ["an empty component", "names weights"]);
    }

    #[test]
    #[should_panic(expected = "not exactly one condition")]
    fn a_path_that_breaks_two_conditions_is_refused() {
        assert_isolated_path("r31-files-two", b"/x.bin", &[]);
    }

    #[test]
    fn block_conditions_are_named_one_by_one() {
        use tpde_codec::rans::{self, Table};
        let plane: Vec<u8> = (0..16_384 + 5u32).map(|i| (i * 7 % 13) as u8).collect();
        let table = Table::from_histogram(&rans::histogram(&plane));
        let mut record = Vec::new();
        rans::encode_blocks(&table, &plane, &mut record);
        let broken = |r: &[u8], in_chunk: usize| broken_block_conditions(table.freqs(), r, in_chunk, plane.len());
        assert!(broken(&record, record.len()).is_empty());
        assert_eq!(broken(&record, record.len() - 2), ["words past the chunk"]);
        let mut finals = record.clone();
        finals[8 + 4 * 40] ^= 1; // block 1's state 8, which takes no symbol
        assert_eq!(broken(&finals, finals.len()), ["a final state other than 2^16"]);
        let mut extra = record.clone();
        extra.extend([0, 0]);
        extra[4..8].copy_from_slice(&(u32::from_le_bytes(record[4..8].try_into().unwrap()) + 1).to_le_bytes());
        assert_eq!(broken(&extra, extra.len()), ["words left over"]);
    }

    #[test]
    fn sparse_conditions_are_named_one_by_one() {
        let good = SparseParts {
            tag: CodecTag::DeltaXorContext,
            n: 16,
            fill: 1,
            positions: vec![2, 5],
            values: vec![0, 7],
            coder: 0,
            values_mode: 2,
            lanes: None,
        };
        assert!(broken_sparse_conditions(&good).is_empty());
        let fill = SparseParts { values: vec![1, 7], ..good.clone() };
        assert_eq!(broken_sparse_conditions(&fill), ["value is not the fill"]);
        let lanes = SparseParts { lanes: Some(2), ..good.clone() };
        assert_eq!(broken_sparse_conditions(&lanes), ["values' lanes at most max(1, ⌈m/4⌉)"]);
        let past = SparseParts { positions: vec![2, 16], ..good.clone() };
        assert_eq!(broken_sparse_conditions(&past), ["positions below n"]);
        let serial = SparseParts { tag: CodecTag::DeltaXor, coder: 2, ..good };
        assert_eq!(broken_sparse_conditions(&serial), ["a tag that allows mode 0x05", "coder is 0 or 1"]);
    }
}

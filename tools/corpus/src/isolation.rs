//! The corpus's isolation rule (conformance/README.md): an invalid file breaks exactly one
//! condition of its rule, or several whose order spec §9's P1–P9 fix. Checked here for the
//! file table's paths (§5.5), each condition written out again, apart from the reference's
//! `check_path`, so that the check does not inherit its bugs.

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
}

//! Model folders on disk, as a framework saves them.

use std::path::{Path, PathBuf};

/// A sharded folder as `save_pretrained` writes one: two shards and an index.
pub fn sharded(dir: &Path, scale: f32) -> PathBuf {
    use safetensors::tensor::{serialize_to_file, Dtype, TensorView};
    let folder = dir.join(format!("model-{scale}"));
    std::fs::create_dir_all(&folder).unwrap();
    let values = |n: usize, seed: f32| -> Vec<u8> {
        (0..n).flat_map(|i| ((i as f32 * 0.37 + seed).sin() * scale).to_le_bytes()).collect()
    };
    let mut weight_map = serde_json::Map::new();
    for (shard, names) in [
        ("model-00001-of-00002.safetensors", ["a.weight", "a.bias"]),
        ("model-00002-of-00002.safetensors", ["b.weight", "b.bias"]),
    ] {
        let data: Vec<(&str, Vec<u8>)> =
            names.iter().enumerate().map(|(k, &n)| (n, values(64 * (k + 1), k as f32))).collect();
        let views: Vec<(&str, TensorView)> =
            data.iter().map(|(n, d)| (*n, TensorView::new(Dtype::F32, vec![d.len() / 4], d).unwrap())).collect();
        let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        serialize_to_file(views, Some(meta), &folder.join(shard)).unwrap();
        for n in names {
            weight_map.insert(n.into(), shard.into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 768}, "weight_map": weight_map});
    std::fs::write(folder.join("model.safetensors.index.json"), index.to_string()).unwrap();
    folder
}

/// Every file under `dir` (links to files read through, links to folders left out), by path:
/// what a folder holds, byte for byte.
pub fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(p) = pending.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let path = e.unwrap().path();
            let link = std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink();
            if path.is_dir() && !link {
                pending.push(path);
            } else if path.is_file() {
                out.insert(
                    path.strip_prefix(dir).unwrap().to_string_lossy().into_owned(),
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    out
}

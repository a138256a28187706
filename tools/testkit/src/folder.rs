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

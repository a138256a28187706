#!/usr/bin/env python3
"""How often the reverse predictions (spec §6.8, predictors 3 and 4) are bit-exact on a real run.

    python tools/bench/reverse_exactness.py [ams]

A 2-layer transformer encoder (width 128) trained from scratch on random regression targets
with torch's AdamW (lr 1e-3, weight decay 0.01; `ams`: amsgrad), fp32, on the CPU; after 5
warm-up steps, 6 steps, each undone in numpy binary32 exactly as §6.8's predictors 3 and 4 give
it (numpy's float32 operations are IEEE binary32, rounded to nearest even). Prints, for the
weights and the second moments, the share predicted bit-exactly and within 1, 4 and 256 units in
the last place (as integers: the bit patterns' difference).
"""
import torch, numpy as np, copy
torch.manual_seed(0)
amsgrad = __import__("sys").argv[1:] == ["ams"]
model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True), 2)
head = torch.nn.Linear(128, 128)
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, amsgrad=amsgrad)
def step():
    x = torch.randn(8, 16, 128); y = torch.randn(8, 16, 128)
    loss = ((head(model(x)) - y) ** 2).mean(); opt.zero_grad(); loss.backward(); opt.step()
def snap():
    return [(p.detach().clone().numpy(), opt.state[p]["exp_avg"].clone().numpy(), opt.state[p]["exp_avg_sq"].clone().numpy(),
             opt.state[p]["max_exp_avg_sq"].clone().numpy() if amsgrad else None, float(opt.state[p]["step"])) for p in params]
f = np.float32
for _ in range(5): step()
stats = {"w": [0, 0, []], "v": [0, 0, []]}
prev = snap()
g = opt.param_groups[0]; b1, b2 = g["betas"]; lr, wd, eps = g["lr"], g["weight_decay"], g["eps"]
for _ in range(6):
    step(); cur = snap()
    for (w0, m0, v0, x0, _), (w1, m1, v1, x1, t) in zip(prev, cur):
        d = f(1 - lr * wd); r = f((1 - b2 ** t) ** 0.5); e = f(eps); h = f(-(lr / (1 - b1 ** t)))
        vv = x1 if amsgrad else v1
        with np.errstate(all="ignore"):
            pw = ((w1 - ((h * m1) / ((np.sqrt(vv) / r) + e))) / d).astype(f)
            a = f(1 - b1); beta = f(b2); c = f(1 - b2)
            gg = m0 + ((m1 - m0) / a)
            pv = ((v1 - ((c * gg) * gg)) / beta).astype(f)
        for k, p, x in (("w", pw, w0), ("v", pv, v0)):
            s = stats[k]; s[0] += int((p.view(np.uint32) == x.view(np.uint32)).sum()); s[1] += p.size
            s[2].append(np.ravel(np.abs(p.view(np.int32).astype(np.int64) - x.view(np.int32).astype(np.int64))))
    prev = cur
for k, (hit, n, diffs) in stats.items():
    dd = np.concatenate(diffs)
    print(k, f"exact {hit/n:.4f}", "ulp<=1", f"{(dd<=1).mean():.4f}", "ulp<=4", f"{(dd<=4).mean():.4f}", "ulp<=256", f"{(dd<=256).mean():.4f}", "median", np.median(dd))

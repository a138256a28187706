"""Optimizer-aware deltas (spec §6.8): the predictions a ``Checkpointer`` offers the writer for
torch's Adam and AdamW, from the optimizer state it flattened: forward (predictors 1 and 2, a
file against the checkpoint before it) and reverse (3 and 4, the checkpoint before a file
against it, the reverse layout's rewrite).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from ._state import _Flattener


def _learning_rates(flat: _Flattener) -> Dict[Tuple[str, int], float]:
    return {
        (path, i): float(g["lr"])
        for path, opt in flat.optimizers
        for i, g in enumerate(opt["param_groups"])
        if isinstance(g, dict) and isinstance(g.get("lr"), (int, float))
    }


def _adam_predictions(flat: _Flattener, last_lrs: Dict[Tuple[str, int], float]) -> List[Tuple]:
    """Predictions (spec §6.8) for ``_tpde.save``: for each Adam/AdamW parameter of an optimizer
    state in ``flat``, its second moment from its first (predictor 1), and candidate weights
    (predictor 2) with the moments' shape, the one at the same place among tensors of that shape
    first. Constants are computed in binary64 as torch's single-tensor step computes them."""
    out: List[Tuple] = []
    prefixes = tuple(f"{path}/" for path, _ in flat.optimizers)
    weights: Dict[Tuple, List[str]] = {}
    for name, t in flat.tensors.items():
        if t.dtype == torch.float32 and not name.startswith(prefixes) and t.numel() > 0:
            weights.setdefault(tuple(t.shape), []).append(name)
    for path, opt in flat.optimizers:
        rank: Dict[Tuple, int] = {}
        for gi, g in enumerate(opt["param_groups"]):
            if not isinstance(g, dict) or not {"betas", "eps", "lr", "weight_decay", "params"} <= set(g):
                continue
            try:
                beta1, beta2 = (float(b) for b in g["betas"])
                eps, wd = float(g["eps"]), float(g["weight_decay"])
                lrs = [float(g["lr"])]
            except (TypeError, ValueError):
                continue  # tensor hyperparameters (capturable, compiled): not predicted
            if (path, gi) in last_lrs and last_lrs[(path, gi)] != lrs[0]:
                lrs.insert(0, last_lrs[(path, gi)])
            decoupled = bool(g.get("decoupled_weight_decay", False))
            for pid in g["params"]:
                st = opt["state"].get(pid)
                base = f"{path}/state/{pid}/" if path else f"state/{pid}/"
                m, v, vmax = base + "exp_avg", base + "exp_avg_sq", base + "max_exp_avg_sq"
                if not isinstance(st, dict) or flat.tensors.get(m) is not st.get("exp_avg"):
                    continue
                if flat.tensors.get(v) is not st.get("exp_avg_sq") or st["exp_avg"].dtype != torch.float32:
                    continue
                out.append((v, 1, [1 - beta1, beta2, 1 - beta2], [m]))
                t = float(st["step"]) if "step" in st else 0.0
                if t < 1:
                    continue
                denom = vmax if g.get("amsgrad") and vmax in flat.tensors else v
                shape = tuple(st["exp_avg"].shape)
                same = weights.get(shape, [])
                k = rank.get(shape, 0)
                rank[shape] = k + 1
                # The weight at the same place among tensors of its shape first, then its
                # neighbours: optimizers list parameters in the model's order.
                order = sorted(range(len(same)), key=lambda i: abs(i - k))[:8]
                for i in order:
                    for lr in lrs:
                        constants = [
                            1 - lr * wd if decoupled else 1.0,
                            (1 - beta2**t) ** 0.5,
                            eps,
                            -(lr / (1 - beta1**t)),
                        ]
                        out.append((same[i], 2, constants, [m, denom]))
    return out


def reverse(predictions: List[Tuple]) -> List[Tuple]:
    """The reverse predictions (predictors 3 and 4, spec 1.9) of the checkpoint one step before
    the state ``predictions`` were computed from, against that state: the same step, undone.
    The constants and names are the forward ones (the step's hyperparameters, the moments'
    tensors); predictor 4 reads the moments from the base, the newer state."""
    return [(name, code + 2, constants, names) for name, code, constants, names in predictions]

#!/usr/bin/env python3
"""How small a checkpoint's delta to its base can get when coded as byte planes, under TPDE's
contexts and richer ones taken from the base checkpoint, per tensor group, on pairs of real
checkpoints.

    python3 tools/bench/bounds.py LABEL:BASE.safetensors:CUR.safetensors [...]

TPDE codes a dense delta as byte planes of the pattern difference (spec §6.4), each plane with a
static table per chunk and per context. For every weights / exp_avg / exp_avg_sq tensor, in the
writer's chunks of 4 MiB, this script takes the difference of the bit patterns both ways
(`zigzag(cur − base)` and `cur XOR base`, the smaller per chunk, as the writer picks) and sums the
code length of each plane under a ladder of context models, each adding to the one before:

  order-0     one table per plane (`delta-sub-lanes`, format 1.2)
  exponent    the base element's exponent mapped as TPDE's writer maps it: the chunk's 16 most
              frequent exponents a table each, every other one the table of the nearest of
              them by value (`delta-*-context`, format 1.4, spec §6.4.1)
  direction   weights: which way the base's exp_avg pushes the weight's pattern, its sign XOR the
              weight's sign (32 contexts; not in the format)
  scale       8 buckets of a second tensor's exponent against this one's: for weights
              e(exp_avg) − e(exp_avg_sq)/2 − e(w), Adam's step in units of the weight's last place;
              for exp_avg e(exp_avg_sq)/2 − e(m), a gradient's size against the moment; for
              exp_avg_sq 2·e(exp_avg) − e(v) (256 contexts; not in the format)
  byte above  each plane also given the element's byte in the plane above, so the planes are
              coded as one value (65 536 contexts; not in the format)

The code length is that of an adaptive coder that learns each context's statistics as it goes
(Krichevsky–Trofimov): a size a real coder reaches, with the cost of learning the statistics
included, where a static coder like TPDE's pays for its tables instead. No coder of a model beats
it by more than about that learning cost, so the rows say what a richer context could gain, and a
target below every row is out of reach for these models. The last column gives the best model's
bits per element of each plane, low byte first: a plane near 8 is noise.

Needs: pip install numpy.
"""
import sys

import numpy as np

from groups import GROUPS, group, read_safetensors

CHUNK_BYTES = 4 << 20
UINT = {"F32": np.uint32, "BF16": np.uint16, "F16": np.uint16}
EXPONENT = {"F32": (23, 0xFF), "BF16": (7, 0xFF), "F16": (10, 0x1F)}
MODELS = ["order-0", "exponent", "direction", "scale", "byte above"]


def read(path):
    """name -> (dtype, element patterns as integers), for the float dtypes above."""
    return {name: (dtype, np.frombuffer(data, UINT[dtype]).astype(np.int64))
            for name, (dtype, data) in read_safetensors(path).items() if dtype in UINT}


def split(name):
    """(group, parameter name) of a tensor: "model.x" and "optimizer.exp_avg.x" share "x"."""
    g = group(name)
    if g not in GROUPS:
        return None, None
    prefix = "model." if g == "weights" else f"optimizer.{g}."
    return g, name[len(prefix):]


def exponent(dtype, u):
    shift, mask = EXPONENT[dtype]
    return (u >> shift) & mask


def sign(dtype, u):
    return (u >> (8 * np.dtype(UINT[dtype]).itemsize - 1)) & 1


def code_bits(symbols, context):
    """Bits an adaptive coder of bytes given these contexts spends on the symbols: the
    Krichevsky–Trofimov code length, counts starting from one half for each of 256 symbols in
    each context. It does not depend on the symbols' order, and it includes the cost of learning
    each context's statistics, which a static coder pays in tables instead."""
    counts = np.bincount(context * 256 + symbols)
    totals = np.bincount(context)
    return _KT_TOTAL[totals].sum() - _KT_SYMBOL[counts].sum()


def _cumulative_log2(offset, n):
    """[sum of log2(i + offset) for i < k, for k = 0 … n]"""
    return np.concatenate(([0.0], np.cumsum(np.log2(np.arange(n) + offset))))


_KT_SYMBOL = _cumulative_log2(0.5, CHUNK_BYTES + 1)
_KT_TOTAL = _cumulative_log2(128.0, CHUNK_BYTES + 1)


def around_median(values, n):
    """values as n contexts: the n around the median, those beyond clamped to the ends."""
    m = int(np.median(values))
    return np.clip(values - (m - n // 2), 0, n - 1)


def writer_map(values, n):
    """values as n contexts the way TPDE's writer maps base contexts (spec §6.4.1): the n most
    frequent values a context each, every other value the context of the nearest of them by
    value."""
    kept, counts = np.unique(values, return_counts=True)
    top = np.sort(kept[np.argsort(-counts, kind="stable")[:n]])
    # The nearest kept value: compare with the neighbours on either side in sorted order.
    hi = np.clip(np.searchsorted(top, values), 0, len(top) - 1)
    lo = np.clip(hi - 1, 0, len(top) - 1)
    nearer_lo = np.abs(values - top[lo]) <= np.abs(top[hi] - values)
    return np.where(nearer_lo, lo, hi)


def contexts(group, dtype, base, partners):
    """The context of every element of a chunk under each model, from the base alone."""
    e = exponent(dtype, base)
    (mdt, m), (vdt, v) = partners
    em, ev = exponent(mdt, m), exponent(vdt, v)
    if group == "weights":
        direction = sign(mdt, m) ^ sign(dtype, base)
        scale = em - ev // 2 - e
    elif group == "exp_avg":
        direction = np.zeros_like(e)
        scale = ev // 2 - em
    else:
        direction = np.zeros_like(e)
        scale = 2 * em - ev
    exp16 = writer_map(e, 16)
    with_direction = exp16 * 2 + direction
    return [np.zeros_like(e), exp16, with_direction,
            with_direction * 8 + around_median(scale, 8)]


def chunk_bits(group, dtype, cur, base, partners):
    """Bits of each plane under each model on one chunk, [model][plane], each model with the
    smaller of the two differences."""
    width = np.dtype(UINT[dtype]).itemsize
    d = cur - base
    half = 1 << (8 * width - 1)
    d = (d + half) % (2 * half) - half
    ctx = contexts(group, dtype, base, partners)
    best = None
    for diff in (np.where(d >= 0, 2 * d, -2 * d - 1), cur ^ base):
        planes = [(diff >> (8 * j)) & 0xFF for j in range(width)]
        bits = [[code_bits(p, c) for p in planes] for c in ctx]
        above = [ctx[-1] * 256 + planes[j + 1] for j in range(width - 1)] + [ctx[-1]]
        bits.append([code_bits(p, c) for p, c in zip(planes, above)])
        bits = np.array(bits)
        best = bits if best is None else np.where(
            bits.sum(1, keepdims=True) < best.sum(1, keepdims=True), bits, best)
    return best


def pair(base_path, cur_path):
    base, cur = read(base_path), read(cur_path)
    totals = {g: [0, 0.0] for g in GROUPS}
    for name, (dtype, c) in cur.items():
        group, param = split(name)
        if group is None or name not in base or base[name][0] != dtype:
            continue
        b = base[name][1]
        m = base.get("optimizer.exp_avg." + param)
        v = base.get("optimizer.exp_avg_sq." + param)
        if m is None or v is None or m[1].size != b.size or v[1].size != b.size:
            continue
        width = np.dtype(UINT[dtype]).itemsize
        step = CHUNK_BYTES // width
        t = totals[group]
        for s in range(0, c.size, step):
            sl = slice(s, s + step)
            t[0] += c[sl].size * width * 8
            t[1] = t[1] + chunk_bits(group, dtype, c[sl], b[sl],
                                     ((m[0], m[1][sl]), (v[0], v[1][sl])))
    return totals


def main():
    if len(sys.argv) < 2 or any(a.count(":") != 2 for a in sys.argv[1:]):
        sys.exit(__doc__)
    print("| pair | group | " + " | ".join(MODELS) + " | best model, bits/element per plane |")
    print("|---|---|" + "---:|" * len(MODELS) + "---|")
    for spec in sys.argv[1:]:
        label, base_path, cur_path = spec.split(":")
        for group, (raw_bits, bits) in pair(base_path, cur_path).items():
            if raw_bits == 0:
                continue
            elements = raw_bits / (8 * bits.shape[1])
            best = bits[bits.sum(1).argmin()]
            planes = " ".join(f"{p / elements:.2f}" for p in best)
            ratios = " | ".join(f"{b / raw_bits:.3f}" for b in bits.sum(1))
            print(f"| {label} | {group} | {ratios} | {planes} |")


if __name__ == "__main__":
    main()

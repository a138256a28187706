#!/usr/bin/env python3
"""Size ratio of a .tpde file per tensor group (model weights, exp_avg, exp_avg_sq, other), from
`tpde-inspect --json`: python3 tools/bench/groups.py FILE.tpde [...]; and the tensor groups,
safetensors reader and interleaved comparison the other bench scripts share."""
import json
import statistics
import struct
import subprocess
import sys


# The groups the benchmarks report, in their order.
GROUPS = ["weights", "exp_avg", "exp_avg_sq"]

# ZipNN's name for each safetensors float dtype it compresses.
ZIPNN_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def group(name: str) -> str:
    if name.startswith("optimizer.exp_avg_sq."):
        return "exp_avg_sq"
    if name.startswith("optimizer.exp_avg."):
        return "exp_avg"
    if name.startswith("model."):
        return "weights"
    return "other"


def interleaved(rounds, before, after):
    """Times two builds alternately, `rounds` times each (`before()` and `after()` return a time):
    their medians and the paired median ratio after/before. A machine whose speed drifts over
    minutes moves both alike within a round."""
    a, b = [], []
    for _ in range(rounds):
        a.append(before())
        b.append(after())
    return statistics.median(a), statistics.median(b), statistics.median(y / x for x, y in zip(a, b))


def read_safetensors(path):
    """name -> (dtype, raw bytes), without numpy's dtype limits (bf16)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], data[s:e])
    return out


def groups(path: str, tool: str = "tpde-inspect") -> dict:
    rep = json.loads(subprocess.run([tool, "--json", path], check=True, capture_output=True).stdout)
    out = {}
    for t in rep["tensors"]:
        g = out.setdefault(group(t["name"]), [0, 0])
        g[0] += t["logical_bytes"]
        g[1] += t["stored_bytes"]
    return out


if __name__ == "__main__":
    for p in sys.argv[1:]:
        for g, (logical, stored) in sorted(groups(p).items()):
            print(f"{p}\t{g}\t{logical}\t{stored}\t{stored / logical:.3f}")

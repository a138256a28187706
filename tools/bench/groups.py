#!/usr/bin/env python3
"""Size ratio of a .tpde file per tensor group (model weights, exp_avg, exp_avg_sq, other), from
`tpde-inspect --json`: python3 tools/bench/groups.py FILE.tpde [...]"""
import json
import subprocess
import sys


def group(name: str) -> str:
    if name.startswith("optimizer.exp_avg_sq."):
        return "exp_avg_sq"
    if name.startswith("optimizer.exp_avg."):
        return "exp_avg"
    if name.startswith("model."):
        return "weights"
    return "other"


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

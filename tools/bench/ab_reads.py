#!/usr/bin/env python3
"""Two builds of the read path compared in fresh processes (a resume reads once, in a new
process), interleaved, on one core pinned and on every core:

    python3 tools/bench/ab_reads.py rust BEFORE AFTER ROUNDS FILE.tpde [...]
        BEFORE and AFTER: builds of `cargo build --release -p tpde --example read_tensors`
        (Reader::read_tensor, tensor by tensor; a delta finds its base by its hint)
    python3 tools/bench/ab_reads.py python BEFORE.so AFTER.so ROUNDS FILE.tpde [...]
        two builds of crates/tpde-py's extension, copied in turn over the installed one
        (target/pyenv, as `maturin develop` leaves it): tpde.torch.load_file, and
        safe_open(...).get_tensor for every tensor. AFTER.so is left installed.

Prints the medians (ms) and the paired median ratio AFTER/BEFORE (groups.interleaved).
"""
import os
import shutil
import subprocess
import sys

from groups import interleaved

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SO = f"{ROOT}/crates/tpde-py/python/tpde/_tpde.abi3.so"
PY = f"{ROOT}/target/pyenv/bin/python"
# The child prints the milliseconds of the read alone (not the interpreter's start or imports).
CHILD = r'''
import sys, time, tpde, tpde.torch
path, how = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if how == "load_file":
    d = tpde.torch.load_file(path)
else:
    with tpde.safe_open(path, "np") as f:
        d = {k: f.get_tensor(k) for k in f.keys()}
print((time.perf_counter() - t) * 1e3)
'''


def main():
    kind, before, after, rounds, files = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
    if kind == "rust":
        ways = {"read_tensor": lambda build, f: [build, f]}
        install = lambda build: None
    else:
        ways = {how: (lambda how: lambda build, f: [PY, "-c", CHILD, f, how])(how) for how in ("load_file", "get_tensor")}
        install = lambda build: shutil.copyfile(build, SO)
    print("| cores | file | read | before ms | after ms | after/before (paired median) |")
    print("|---|---|---|---:|---:|---:|")
    for cores in ("1", "2"):
        env = dict(os.environ, RAYON_NUM_THREADS=cores)
        pin = ["taskset", "-c", "1"] if cores == "1" else []
        for f in files:
            for how, cmd in ways.items():
                def read(build):
                    install(build)
                    out = subprocess.run(pin + cmd(build, f), env=env, capture_output=True, text=True, check=True)
                    return float(out.stdout.split()[0])

                a, b, ratio = interleaved(rounds, lambda: read(before), lambda: read(after))
                print(f"| {cores} | {os.path.basename(f)} | {how} | {a:.1f} | {b:.1f} | {ratio:.3f} |", flush=True)
    install(after)


if __name__ == "__main__":
    main()

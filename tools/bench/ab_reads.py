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

Prints the medians (ms) and the paired median ratio AFTER/BEFORE. A machine whose speed drifts
over minutes moves both alike within a round.
"""
import os
import shutil
import statistics
import subprocess
import sys

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
                ms = {before: [], after: []}
                for _ in range(rounds):
                    for build in (before, after):
                        install(build)
                        out = subprocess.run(pin + cmd(build, f), env=env, capture_output=True, text=True, check=True)
                        ms[build].append(float(out.stdout.split()[0]))
                ratio = statistics.median(b / a for a, b in zip(ms[before], ms[after]))
                print(f"| {cores} | {os.path.basename(f)} | {how} | {statistics.median(ms[before]):.1f} | "
                      f"{statistics.median(ms[after]):.1f} | {ratio:.3f} |", flush=True)
    install(after)


if __name__ == "__main__":
    main()

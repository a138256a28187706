#!/usr/bin/env python3
"""What a delta costs to decode, in keyframes: `tpde unpack` of a delta (which decodes its base
too) minus `tpde unpack` of the base keyframe, over the keyframe's own time. One core pinned
(RAYON_NUM_THREADS=1, taskset -c 0), output to /dev/shm, median of --runs, under each
instruction set TPDE_ISA allows (avx512 falls back to avx2 where the CPU lacks it).

    python3 tools/bench/delta_decode.py KEYFRAME.tpde DELTA.tpde [DELTA.tpde ...]
                                        [--tpde target/release/tpde] [--runs 7]

Issue 68: a delta of 4% of raw bytes decoded slower than the keyframe it replaces.
"""
import argparse
import os
import statistics
import subprocess
import time


def unpack(tpde, path, env, runs):
    out = "/dev/shm/tpde-delta-decode.safetensors"
    times = []
    for _ in range(runs):
        if os.path.exists(out):
            os.remove(out)
        t0 = time.perf_counter()
        subprocess.run(["taskset", "-c", "0", tpde, "unpack", path, "-o", out], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    os.remove(out)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keyframe")
    ap.add_argument("deltas", nargs="+")
    ap.add_argument("--tpde", default="target/release/tpde")
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    print("| ISA | file | bytes | unpack ms | delta's own / keyframe |")
    print("|---|---|---:|---:|---:|")
    for isa in ("avx512", "avx2"):
        env = dict(os.environ, RAYON_NUM_THREADS="1", TPDE_ISA=isa)
        k = unpack(a.tpde, a.keyframe, env, a.runs)
        print(f"| {isa} | {os.path.basename(a.keyframe)} | {os.path.getsize(a.keyframe)} | {k * 1e3:.1f} | 1 |")
        for d in a.deltas:
            t = unpack(a.tpde, d, env, a.runs)
            print(f"| {isa} | {os.path.basename(d)} | {os.path.getsize(d)} | {t * 1e3:.1f} | {(t - k) / k:.2f} |")


if __name__ == "__main__":
    main()

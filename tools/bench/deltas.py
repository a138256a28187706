#!/usr/bin/env python3
"""Side-by-side benchmark of TPDE keyframes and deltas against zstd -3, zstd -19, ZipNN and the
"XOR with the previous checkpoint, byte planes, zstd" baseline, on pairs of real checkpoints, in
one run.

    python3 tools/bench/deltas.py LABEL:BASE.safetensors:CUR.safetensors [...] [--runs 3]
                                  [--tpde target/release/tpde] [--dir /dev/shm/tpde-bench]

Sizes are per tensor group (weights, exp_avg, exp_avg_sq) as a share of the raw tensor bytes.
Speeds are MB/s of raw tensor bytes of the whole checkpoint, median of --runs (zstd -19: one
run), file to file on --dir (a tmpfs measures codecs, not disks): `tpde pack`/`tpde unpack`
against `zstd`/`zstd -d`; ZipNN in-process per tensor through its Python API. "1 core" is one
thread (RAYON_NUM_THREADS=1, zstd -T1, ZipNN threads=1) with the process pinned to one CPU,
because zstd -T1 and zstd -d still write on a second thread (asynchronous I/O) and would
otherwise use more than one core; "all" is every core, unpinned (zstd -d: its default). The CPUs
each unpinned zstd run used (CPU time / wall time) are printed after the tables.

Needs: zstd on PATH, pip install numpy zstandard zipnn.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import zstandard

from groups import GROUPS, ZIPNN_DTYPE, group, groups, read_safetensors



def planes_xor_zstd(cur, base, width):
    x = np.frombuffer(cur, np.uint8) ^ np.frombuffer(base, np.uint8)
    planes = x.reshape(-1, width).T
    c = zstandard.ZstdCompressor(level=3)
    return sum(len(c.compress(planes[j].tobytes())) for j in range(width))


WIDTH = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8}


def zipnn_all(tensors, threads):
    """(compressed bytes per group, compress seconds, decompress seconds, round trip ok)."""
    import zipnn

    sizes = {}
    tc = td = 0.0
    ok = True
    coders = {}
    for name, (dt, b) in tensors.items():
        g = group(name)
        if dt not in ZIPNN_DTYPE or len(b) == 0:
            sizes[g] = sizes.get(g, 0) + len(b)
            continue
        z = coders.setdefault(dt, zipnn.ZipNN(input_format="byte", bytearray_dtype=ZIPNN_DTYPE[dt], threads=threads))
        # A copy: ZipNN 0.5.4's compress reorders its input's bytes in place, which made every
        # later run compress scrambled bytes and compare its round trip with them.
        src = bytearray(b)
        t = time.perf_counter()
        c = z.compress(src)
        tc += time.perf_counter() - t
        t = time.perf_counter()
        d = z.decompress(c)
        td += time.perf_counter() - t
        ok &= bytes(d) == b
        sizes[g] = sizes.get(g, 0) + len(c)
    return sizes, tc, td, ok


ONE_CPU = {min(os.sched_getaffinity(0))}


def pin():
    """Pins the calling process (a child before exec, or this one) to one CPU."""
    os.sched_setaffinity(0, ONE_CPU)


def timed(cmd, env=None, runs=3, one_core=False, cpus=None):
    """Median wall seconds of `cmd`; pinned to one CPU when `one_core`. `cpus`, a list, gets the
    median CPUs used (user + system time of the child / wall time)."""
    ts, used = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       preexec_fn=pin if one_core else None)
        ts.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        used.append(cpu / ts[-1])
    if cpus is not None:
        cpus.append(statistics.median(used))
    return statistics.median(ts)


def tpde_groups(tpde, path):
    """Stored bytes per group."""
    inspect = os.path.join(os.path.dirname(tpde), "tpde-inspect")
    return {g: stored for g, (_, stored) in groups(path, inspect).items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tpde", default="target/release/tpde")
    ap.add_argument("--dir", default="/dev/shm/tpde-bench")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    tpde = os.path.abspath(a.tpde)
    cores = os.cpu_count()
    env1 = dict(os.environ, RAYON_NUM_THREADS="1")
    envn = dict(os.environ, RAYON_NUM_THREADS=str(cores))
    results = []
    for spec in a.pairs:
        label, base_path, cur_path = spec.split(":")
        cur = read_safetensors(cur_path)
        base = read_safetensors(base_path)
        raw = {g: 0 for g in GROUPS + ["other"]}
        for n, (dt, b) in cur.items():
            raw[group(n)] += len(b)
        total_raw = sum(raw.values())
        sizes = {}
        # Sizes per group.
        for level in (3, 19):
            c = zstandard.ZstdCompressor(level=level, threads=-1)
            sizes[f"zstd -{level}"] = {
                g: len(c.compress(b"".join(b for n, (dt, b) in cur.items() if group(n) == g))) for g in GROUPS
            }
        xs = {g: 0 for g in GROUPS}
        for n, (dt, b) in cur.items():
            g = group(n)
            if g in xs:
                xs[g] += planes_xor_zstd(b, base[n][1], WIDTH[dt])
        sizes["XOR+planes+zstd"] = xs
        # ZipNN as TPDE and zstd are timed: a warm-up run, then the median of --runs.
        everywhere = os.sched_getaffinity(0)
        pin()
        zipnn_all(cur, 1)
        one = [zipnn_all(cur, 1) for _ in range(a.runs)]
        os.sched_setaffinity(0, everywhere)
        zipnn_all(cur, 0)
        all_cores = [zipnn_all(cur, 0) for _ in range(a.runs)]
        z1, zok = one[0][0], all(r[3] for r in one)
        zc1, zd1 = (statistics.median(r[k] for r in one) for k in (1, 2))
        zcn, zdn = (statistics.median(r[k] for r in all_cores) for k in (1, 2))
        sizes["ZipNN"] = z1
        key = os.path.join(a.dir, "key.tpde")
        delta = os.path.join(a.dir, "delta.tpde")
        back = os.path.join(a.dir, "back.safetensors")
        subprocess.run([tpde, "pack", cur_path, "-o", key], check=True, capture_output=True)
        subprocess.run([tpde, "pack", cur_path, "--base", base_path, "-o", delta], check=True, capture_output=True)
        sizes["TPDE keyframe"] = tpde_groups(tpde, key)
        sizes["TPDE delta"] = tpde_groups(tpde, delta)
        # Bit-exact check of the delta through the CLI.
        subprocess.run([tpde, "verify", delta, "--base", base_path, "--against", cur_path], check=True, capture_output=True)
        # Speeds, MB/s of raw tensor bytes.
        mb = total_raw / 1e6
        zst = os.path.join(a.dir, "cur.zst")
        out = os.path.join(a.dir, "out.bin")
        speed = {}
        cpus = {"zstd -3 -T1": [], "zstd -d": []}
        timed(["zstd", "-q", "-f", "-3", "-T1", cur_path, "-o", zst], runs=a.runs, cpus=cpus["zstd -3 -T1"])
        speed["zstd -3"] = (
            mb / timed(["zstd", "-q", "-f", "-3", "-T1", cur_path, "-o", zst], runs=a.runs, one_core=True),
            mb / timed(["zstd", "-q", "-f", "-3", "-T0", cur_path, "-o", zst], runs=a.runs),
            mb / timed(["zstd", "-q", "-f", "-d", zst, "-o", out], runs=a.runs, one_core=True),
            mb / timed(["zstd", "-q", "-f", "-d", zst, "-o", out], runs=a.runs, cpus=cpus["zstd -d"]),
        )
        speed["zstd -19"] = (
            None,
            mb / timed(["zstd", "-q", "-f", "-19", "-T0", cur_path, "-o", zst], runs=1),
            mb / timed(["zstd", "-q", "-f", "-d", zst, "-o", out], runs=a.runs, one_core=True),
            mb / timed(["zstd", "-q", "-f", "-d", zst, "-o", out], runs=a.runs),
        )
        speed["ZipNN"] = (mb / zc1, mb / zcn, mb / zd1, mb / zdn)
        for name, extra in (("TPDE keyframe", []), ("TPDE delta", ["--base", base_path])):
            f = key if name == "TPDE keyframe" else delta
            speed[name] = (
                mb / timed([tpde, "pack", cur_path, "-o", f] + extra, env=env1, runs=a.runs, one_core=True),
                mb / timed([tpde, "pack", cur_path, "-o", f] + extra, env=envn, runs=a.runs),
                mb / timed([tpde, "unpack", f, "-o", back] + extra, env=env1, runs=a.runs, one_core=True),
                mb / timed([tpde, "unpack", f, "-o", back] + extra, env=envn, runs=a.runs),
            )
        results.append({"label": label, "raw": raw, "sizes": sizes, "speed": speed, "zipnn_round_trip": zok,
                        "zstd_cpus_unpinned": {k: v[0] for k, v in cpus.items()}})
        print(f"done {label}", file=sys.stderr, flush=True)

    print("### Size / raw tensor bytes (lower is better)\n")
    print("| checkpoint pair | group | " + " | ".join(results[0]["sizes"].keys()) + " |")
    print("|---|---|" + "---:|" * len(results[0]["sizes"]))
    for r in results:
        for g in GROUPS:
            if r["raw"][g] == 0:
                continue
            cells = [f"{r['sizes'][k].get(g, 0) / r['raw'][g]:.3f}" for k in r["sizes"]]
            print(f"| {r['label']} | {g} | " + " | ".join(cells) + " |")
    print(f"\n### MB/s of raw tensor bytes ({cores} cores; median of {a.runs})\n")
    print("| checkpoint pair | tool | encode 1 core | encode all | decode 1 core | decode all |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        for tool, s in r["speed"].items():
            cells = list(s)
            fmt = lambda v: "n/a" if v is None else f"{v:.0f}"
            print(f"| {r['label']} | {tool} | " + " | ".join(fmt(c) for c in cells) + " |")
    print("\nCPUs used by unpinned zstd (CPU time / wall time): "
          + ", ".join(f"{r['label']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["zstd_cpus_unpinned"].items())
                      for r in results))
    print("ZipNN round trip bit-exact: " + ", ".join(f"{r['label']}: {r['zipnn_round_trip']}" for r in results))
    with open(os.path.join(a.dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

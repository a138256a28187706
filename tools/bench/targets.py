#!/usr/bin/env python3
"""Issue 38's targets, measured from Python as a user restores: per tensor group of a pair of
real checkpoints, in one run and interleaved,

- the keyframe's `tpde.torch.load_file` time over ZipNN's decompress time of the same tensors;
- a delta's `load_file` on top of its decoded base over the keyframe's `load_file`. The delta is
  read against the base's own keyframe, and the base's `load_file` is subtracted run by run
  (paired medians); the delta read against the base's `.safetensors` is shown too, which costs
  a BLAKE3 pass over the base to check its content digest;
- `tpde.pack` of the keyframe and of the delta (its base a `.safetensors`), GB/s of raw bytes;

on one core (RAYON_NUM_THREADS=1, ZipNN threads=1, the process pinned to one CPU) and on all
cores. Medians of --runs; sizes as a share of the raw bytes.

    python3 tools/bench/targets.py LABEL:GROUPS:BASE.safetensors:CUR.safetensors [...]
                                   [--runs 7] [--dir /dev/shm/tpde-targets]

GROUPS: comma-separated groups of groups.py (weights, exp_avg, exp_avg_sq), e.g.
`fp32-moments:exp_avg,exp_avg_sq:step10.safetensors:step20.safetensors`. Needs the tpde
package, torch and zipnn.
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

from groups import ZIPNN_DTYPE, group, read_safetensors



def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes)."""
    header, offset = {}, 0
    for name, (dt, shape, b) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, b in tensors.values():
            f.write(b)


def subset(path, wanted):
    """The tensors of `path` in the groups `wanted`, with their shapes."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = read_safetensors(path)
    return {k: (header[k]["dtype"], header[k]["shape"], data[k][1]) for k in data if group(k) in wanted}


def child(folder, runs):
    """Times one configuration (the caller sets threads and affinity); prints JSON."""
    import torch
    import tpde
    import tpde.torch
    import zipnn

    threads = 1 if os.environ.get("RAYON_NUM_THREADS") == "1" else 0
    base, cur = (os.path.join(folder, f) for f in ("base.safetensors", "cur.safetensors"))
    key, delta, base_key = (os.path.join(folder, f) for f in ("key.tpde", "delta.tpde", "base.tpde"))
    tpde.pack(base, base_key, progress=False)
    tensors = read_safetensors(cur)
    raw = sum(len(b) for _, b in tensors.values())
    coders, packed = {}, {}
    for name, (dt, b) in tensors.items():
        z = coders.setdefault(dt, zipnn.ZipNN(input_format="byte", bytearray_dtype=ZIPNN_DTYPE[dt], threads=threads))
        # A copy: ZipNN 0.5.4's compress reorders its input's bytes in place.
        packed[name] = (z, z.compress(bytearray(b)))

    def clock(f):
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    times = {k: [] for k in ("pack_key", "pack_delta", "load_key", "load_delta", "zipnn", "load_base", "on_base")}
    for _ in range(runs):
        times["pack_key"].append(clock(lambda: tpde.pack(cur, key, progress=False)))
        times["pack_delta"].append(clock(lambda: tpde.pack(cur, delta, base=base, progress=False)))
        times["load_key"].append(clock(lambda: tpde.torch.load_file(key)))
        times["load_delta"].append(clock(lambda: tpde.torch.load_file(delta, base=base)))
        times["load_base"].append(clock(lambda: tpde.torch.load_file(base_key)))
        times["on_base"].append(clock(lambda: tpde.torch.load_file(delta, base=base_key)) - times["load_base"][-1])
        times["zipnn"].append(clock(lambda: [z.decompress(c) for z, c in packed.values()]))
    # Bit-exact, once, outside the timing.
    got = tpde.torch.load_file(delta, base=base_key)
    ok = all(got[n].contiguous().view(-1).view(torch.uint8).numpy().tobytes() == b
             for n, (_, b) in tensors.items())
    print(json.dumps({
        "raw": raw,
        "sizes": {"key": os.path.getsize(key) / raw, "delta": os.path.getsize(delta) / raw,
                  "zipnn": sum(len(c) for _, c in packed.values()) / raw},
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "bit_exact": ok,
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="*")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", default="/dev/shm/tpde-targets")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.runs)
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "unknown CPU")
    print(f"{cpu}, {os.cpu_count()} cores; medians of {a.runs} runs; times in ms\n")
    print("| row | raw MB | ZipNN / keyframe / delta size | cores | keyframe load | ZipNN decompress "
          "| keyframe / ZipNN | delta, base .safetensors | delta on decoded base | its / keyframe "
          "| pack keyframe / delta GB/s |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    for row in a.rows:
        label, wanted, base, cur = row.split(":")
        folder = os.path.join(a.dir, label)
        os.makedirs(folder, exist_ok=True)
        wanted = set(wanted.split(","))
        write_safetensors(os.path.join(folder, "base.safetensors"), subset(base, wanted))
        write_safetensors(os.path.join(folder, "cur.safetensors"), subset(cur, wanted))
        for cores in ("1", "all"):
            env = dict(os.environ)
            one = cores == "1"
            if one:
                env["RAYON_NUM_THREADS"] = "1"
            else:
                env.pop("RAYON_NUM_THREADS", None)
            pin = (lambda: os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})) if one else None
            out = subprocess.run([sys.executable, __file__, "--child", folder, "--runs", str(a.runs)], env=env,
                                 check=True, capture_output=True, text=True, preexec_fn=pin).stdout
            r = json.loads(out)
            m, s = r["median_s"], r["sizes"]
            gbs = lambda t: r["raw"] / t / 1e9
            print(f"| {label} | {r['raw'] / 1e6:.1f} | {s['zipnn']:.3f} / {s['key']:.3f} / {s['delta']:.3f} | {cores} "
                  f"| {m['load_key'] * 1e3:.1f} | {m['zipnn'] * 1e3:.1f} | {m['load_key'] / m['zipnn']:.2f} "
                  f"| {m['load_delta'] * 1e3:.1f} | {m['on_base'] * 1e3:.1f} | {m['on_base'] / m['load_key']:.2f} "
                  f"| {gbs(m['pack_key']):.2f} / {gbs(m['pack_delta']):.2f} |"
                  + ("" if r["bit_exact"] else " NOT BIT-EXACT"), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two builds of the `tpde` command compared on one core, interleaved: for each row folder
(holding base.safetensors and cur.safetensors, as tools/bench/targets.py leaves them under
/dev/shm/tpde-targets), each binary packs its own keyframe and delta, then the rounds alternate
the two binaries on: unpack the keyframe, unpack the delta against the base's .safetensors, pack
the keyframe, pack the delta. Prints the medians (ms), the paired median ratio B/A and the sizes.

    python3 tools/bench/ab_cli.py BEFORE/tpde AFTER/tpde ROUNDS ROW_DIR [...]
"""
import os
import subprocess
import sys
import time

from groups import interleaved

ENV = dict(os.environ, RAYON_NUM_THREADS="1")


def run(cmd):
    """Wall seconds of `cmd` pinned to one CPU."""
    t = time.perf_counter()
    subprocess.run(["taskset", "-c", "1"] + cmd, check=True, env=ENV, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    a_bin, b_bin, rounds, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    print("| row | op | A ms | B ms | B/A (paired median) |\n|---|---|---:|---:|---:|")
    for d in rows:
        cur, base = f"{d}/cur.safetensors", f"{d}/base.safetensors"
        for tag, t in (("a", a_bin), ("b", b_bin)):
            run([t, "pack", cur, "-o", f"/dev/shm/ab-k{tag}.tpde"])
            run([t, "pack", cur, "--base", base, "-o", f"/dev/shm/ab-d{tag}.tpde"])
        ops = {
            "unpack keyframe": lambda t, g: [t, "unpack", f"/dev/shm/ab-k{g}.tpde", "-o", "/dev/shm/ab-out.safetensors"],
            "unpack delta (base .safetensors)": lambda t, g: [t, "unpack", f"/dev/shm/ab-d{g}.tpde", "--base", base,
                                                              "-o", "/dev/shm/ab-out.safetensors"],
            "pack keyframe": lambda t, g: [t, "pack", cur, "-o", f"/dev/shm/ab-k{g}.tpde"],
            "pack delta": lambda t, g: [t, "pack", cur, "--base", base, "-o", f"/dev/shm/ab-d{g}.tpde"],
        }
        for name, cmd in ops.items():
            a, b, ratio = interleaved(rounds, lambda: run(cmd(a_bin, "a")), lambda: run(cmd(b_bin, "b")))
            print(f"| {os.path.basename(d)} | {name} | {a * 1e3:.1f} | {b * 1e3:.1f} | {ratio:.3f} |", flush=True)
        size = lambda g: f"{os.path.getsize(f'/dev/shm/ab-k{g}.tpde')} / {os.path.getsize(f'/dev/shm/ab-d{g}.tpde')}"
        print(f"| {os.path.basename(d)} | sizes keyframe / delta | {size('a')} | {size('b')} | |", flush=True)


if __name__ == "__main__":
    main()

"""Reading .tpde files from object storage, next to downloading them first.

Starts s3s-fs (S3 over a local folder, `cargo install s3s-fs --features binary`) on 127.0.0.1,
or uses the bucket the AWS_* variables point at with --bucket; writes a checkpoint of
--size-mb of f32 weights (32 layers and a small norm tensor), uploads it, and measures, each the
median of --runs:

- open + one small tensor, straight from the object: time, GET requests, bytes received;
- the same after downloading the whole object (`tpde.copy`, as `aws s3 cp` would);
- every tensor straight from the object (`safe_open(url).get_tensor` of each), with its GETs;
- download, then `load_file` of the local copy.

    python tools/bench/object_store.py [--size-mb 1024] [--runs 3] [--codec auto]
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tpde
import tpde.numpy
from tpde import _tpde


def start_server(root: Path):
    exe = os.environ.get("S3S_FS") or shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "bench").mkdir(parents=True)
    server = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--access-key", "AK", "--secret-key", "SK", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="AK",
        AWS_SECRET_ACCESS_KEY="SK",
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
    )
    return server, "bench"


def median_time(runs, f):
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--codec", default="auto")
    ap.add_argument("--bucket", help="use this bucket (AWS_* variables) instead of a local s3s-fs")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tpde-bench-s3-"))
    server = None
    try:
        if args.bucket:
            bucket = args.bucket
        else:
            server, bucket = start_server(work / "s3")
        rng = np.random.default_rng(0)
        per = args.size_mb * 2**20 // 4 // 32
        tensors = {f"layers.{i}.weight": (rng.standard_normal(per, dtype=np.float32) * 0.02) for i in range(32)}
        tensors["norm.weight"] = np.ones(1024, dtype=np.float32)
        local = work / "model.tpde"
        tpde.numpy.save_file(tensors, local, codec=args.codec)
        url = f"s3://{bucket}/bench/model.tpde"
        size = local.stat().st_size
        up, _ = median_time(1, lambda: tpde.copy(local, url))
        down_path = work / "down.tpde"

        def remote_one():
            with tpde.safe_open(url, framework="np") as f:
                x = f.get_tensor("norm.weight")
                return f._f().object_stats(), x

        t_remote_one, (stats, _) = median_time(args.runs, remote_one)

        def download_then_one():
            tpde.copy(url, down_path)
            with tpde.safe_open(down_path, framework="np") as f:
                return f.get_tensor("norm.weight")

        t_download_one, _ = median_time(args.runs, download_then_one)
        def remote_all():
            with tpde.safe_open(url, framework="np") as f:
                return {k: f.get_tensor(k) for k in f.keys()}, f._f().object_stats()

        t_remote_all, (got, all_stats) = median_time(args.runs, remote_all)
        assert all(np.array_equal(got[k], v) for k, v in tensors.items()), "bit-exact"
        t_download_all, _ = median_time(args.runs, lambda: (tpde.copy(url, down_path), tpde.numpy.load_file(down_path)))
        t_download, _ = median_time(args.runs, lambda: tpde.copy(url, down_path))
        logical = sum(v.nbytes for v in tensors.values())

        where = f"bucket {bucket}" if args.bucket else "s3s-fs on 127.0.0.1"
        print(f"object: {size / 1e6:.0f} MB ({args.codec}; {logical / 1e6:.0f} MB of f32), {where}, "
              f"median of {args.runs}; upload (tpde.copy) {size / 1e6 / up:.0f} MB/s\n")
        print("| what | time | GETs | bytes received |")
        print("|---|---:|---:|---:|")
        print(f"| open + one 4 KB tensor, from the object | {t_remote_one * 1e3:.1f} ms | {stats[0]} | {stats[1] / 1e3:.0f} KB |")
        print(f"| download whole (tpde.copy), then open + the tensor | {t_download_one * 1e3:.0f} ms | | {size / 1e3:.0f} KB |")
        print(f"| load every tensor, from the object | {t_remote_all:.2f} s ({logical / 1e9 / t_remote_all:.2f} GB/s) "
              f"| {all_stats[0]} | {all_stats[1] / 1e3:.0f} KB |")
        print(f"| download whole, then load every tensor locally | {t_download_all:.2f} s ({logical / 1e9 / t_download_all:.2f} GB/s) | | |")
        print(f"| download whole alone | {t_download:.2f} s ({size / 1e9 / t_download:.2f} GB/s) | | |")
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

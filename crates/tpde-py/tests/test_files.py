"""save_file / load_file / safe_open: every dtype, shapes, metadata, slices, deltas, bad input."""
import errno
import os

import ml_dtypes
import numpy as np
import pytest
import torch

import tpde
import tpde.numpy
import tpde.torch

RNG = np.random.default_rng(7)

NUMPY_DTYPES = [
    np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, ml_dtypes.bfloat16, np.float32, np.float64, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
]
TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def random_array(dtype, shape):
    """Random bit patterns (NaNs and infinities included): a round trip must keep every bit."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    raw = RNG.integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw & 1
    return raw.view(dtype).reshape(shape)


def torch_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("codec", ["auto", "raw", "zstd"])
def test_numpy_every_dtype_and_shape_round_trips(tmp_path, codec):
    tensors = {}
    for dt in NUMPY_DTYPES:
        name = np.dtype(dt).name
        tensors[f"{name}/matrix"] = random_array(dt, (37, 129))
        tensors[f"{name}/scalar"] = random_array(dt, ())
        tensors[f"{name}/empty"] = random_array(dt, (0, 5))
    # Big enough for several chunks and rANS lanes.
    tensors["big"] = RNG.standard_normal((1100, 1000)).astype(np.float32)
    path = tmp_path / "a.tpde"
    report = tpde.numpy.save_file(tensors, path, metadata={"epoch": "3"}, codec=codec)
    assert report["tensors"] == len(tensors)
    back = tpde.numpy.load_file(path)
    assert list(back) == list(tensors)
    for k in tensors:
        assert same_bits(tensors[k], back[k]), k
    with tpde.safe_open(path, framework="np") as f:
        assert f.metadata() == {"epoch": "3"}
        assert f.keys() == list(tensors)


def test_torch_every_dtype_noncontiguous_and_tied(tmp_path):
    tensors = {}
    for dt in TORCH_DTYPES:
        base = torch.from_numpy(random_array(np.uint8, (64, 48 * 8))).view(dt)  # any bits
        tensors[f"{dt}/t"] = base.t()  # non-contiguous
        tensors[f"{dt}/scalar"] = base[3, 5].clone()
        tensors[f"{dt}/empty"] = base[:0]
    emb = torch.randn(1000, 64)
    tensors["embed"] = emb
    tensors["lm_head"] = emb  # tied: two names, one storage
    path = tmp_path / "t.tpde"
    tpde.torch.save_file(tensors, path)
    back = tpde.torch.load_file(path)
    for k, t in tensors.items():
        b = back[k]
        assert b.dtype == t.dtype and b.shape == t.shape, k
        assert torch_bytes(b) == torch_bytes(t), k
    # The tied tensor is stored once: the file is not larger than with one copy.
    one = tmp_path / "one.tpde"
    tpde.torch.save_file({k: v for k, v in tensors.items() if k != "lm_head"}, one)
    assert os.path.getsize(path) < os.path.getsize(one) + 1024


def test_raw_tensors_are_read_only_views_and_torch_gets_a_copy(tmp_path):
    a = np.arange(1000, dtype=np.float32)
    path = tmp_path / "raw.tpde"
    tpde.numpy.save_file({"a": a}, path, codec="raw")
    with tpde.safe_open(path, framework="np") as f:
        v = f.get_tensor("a")
    assert not v.flags.writeable and not v.flags.owndata
    with pytest.raises(ValueError):
        v[0] = 1.0
    del f
    assert v[999] == 999.0  # the map stays alive with the array
    t = tpde.torch.load_file(path)["a"]
    t[0] = 5.0  # a copy: writing neither crashes nor changes the file
    back = tpde.numpy.load_file(path)["a"]
    assert back[0] == 0.0 and not back.flags.writeable  # load_file views the map too


def test_slices_read_the_right_elements(tmp_path):
    a = RNG.standard_normal((300, 70, 3)).astype(np.float32)
    path = tmp_path / "s.tpde"
    # Small chunks, so that a slice covers some chunks and not others.
    tpde.numpy.save_file({"a": a}, path)
    keys = [
        np.s_[5:17], np.s_[-3:], np.s_[::7, 3], np.s_[4, 5, 2], np.s_[..., 1], np.s_[10:0:-3, ::-2],
        np.s_[:, 69], np.s_[7:7], np.s_[299], np.s_[...],
    ]
    with tpde.safe_open(path, framework="np") as f:
        sl = f.get_slice("a")
        assert sl.get_shape() == [300, 70, 3] and sl.get_dtype() == "f32"
        for k in keys:
            assert same_bits(np.ascontiguousarray(a[k]), np.ascontiguousarray(sl[k])), k
        with pytest.raises(tpde.TpdeError):
            sl[300]
    with tpde.safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_slice("a")[2:4, :, 1], torch.from_numpy(a[2:4, :, 1].copy()))


def test_deltas_against_tpde_and_safetensors_bases(tmp_path):
    from safetensors.numpy import save_file as st_save

    w0 = RNG.standard_normal((512, 256)).astype(np.float32)
    step0 = {"w": w0, "count": np.array([1, 2, 3], dtype=np.int64)}
    w1 = w0.copy()
    w1[::5] += np.float32(1e-3)  # a fifth of the rows change
    step1 = {"w": w1, "count": np.array([1, 2, 4], dtype=np.int64), "new": np.ones(3, np.float16)}
    tpde.numpy.save_file(step0, tmp_path / "s0.tpde")
    st_save(step0, str(tmp_path / "s0.safetensors"))
    full = tpde.numpy.save_file(step1, tmp_path / "full.tpde")
    for base in ["s0.tpde", "s0.safetensors"]:
        out = tmp_path / f"s1-{base}.tpde"
        rep = tpde.numpy.save_file(step1, out, base=tmp_path / base)
        assert rep["delta_tensors"] == 2
        assert rep["file_bytes"] < full["file_bytes"] * 0.6
        back = tpde.numpy.load_file(out)  # base found through its path hint
        for k in step1:
            assert same_bits(step1[k], back[k])
        back = tpde.numpy.load_file(out, base=tmp_path / base)
        assert same_bits(step1["w"], back["w"])


def test_lossy_delta_within_bound(tmp_path):
    w0 = RNG.standard_normal(10000).astype(np.float32)
    w1 = w0 + RNG.uniform(-2e-3, 2e-3, size=w0.shape).astype(np.float32)
    tpde.numpy.save_file({"w": w0}, tmp_path / "a.tpde")
    tpde.numpy.save_file({"w": w1}, tmp_path / "b.tpde", base=tmp_path / "a.tpde", max_abs_error=1e-3)
    back = tpde.numpy.load_file(tmp_path / "b.tpde")["w"]
    err = np.abs(back.astype(np.float64) - w1.astype(np.float64))
    assert err.max() <= 1e-3
    assert 0 < np.count_nonzero(back == w0) < w0.size  # some changes were dropped, not all
    with pytest.raises(tpde.TpdeError) as e:
        tpde.numpy.save_file({"w": w1}, tmp_path / "c.tpde", max_abs_error=1e-3)  # no base
    assert e.value.kind == "invalid-argument"


def corrupt(path, offset_from_end=None, offset=None):
    data = bytearray(path.read_bytes())
    i = offset if offset is not None else len(data) - offset_from_end
    data[i] ^= 0x40
    path.write_bytes(bytes(data))


def test_bad_input_raises_tpde_error_with_kind(tmp_path):
    a = {"w": RNG.standard_normal((256, 256)).astype(np.float32)}
    good = tmp_path / "good.tpde"
    tpde.numpy.save_file(a, good, codec="raw")
    size = good.stat().st_size

    def kind_of(path, **kw):
        with pytest.raises(tpde.TpdeError) as e:
            tpde.numpy.load_file(path, **kw)
        assert str(e.value)  # says what
        return e.value.kind

    (tmp_path / "text.tpde").write_bytes(b"this is not a checkpoint at all, just some text" * 4)
    assert kind_of(tmp_path / "text.tpde") == "not-tpde"
    (tmp_path / "cut.tpde").write_bytes(good.read_bytes()[: size // 2])
    assert kind_of(tmp_path / "cut.tpde") == "truncated"
    bad = tmp_path / "bad.tpde"
    bad.write_bytes(good.read_bytes())
    corrupt(bad, offset=4096)  # inside the tensor's chunk
    assert kind_of(bad) == "checksum-mismatch"
    assert kind_of(tmp_path / "missing.tpde") == "not-found"
    # ... and a FileNotFoundError too, with its errno, wherever the path came in.
    for load in (tpde.numpy.load_file, lambda p: tpde.safe_open(p, "np"), tpde.torch.load_file):
        with pytest.raises(FileNotFoundError) as e:
            load(tmp_path / "missing.tpde")
        assert isinstance(e.value, tpde.TpdeNotFoundError) and e.value.errno == errno.ENOENT
        assert str(tmp_path / "missing.tpde") in str(e.value)
    # A delta read against a base it was not written against.
    w = a["w"].copy()
    w[::3] += np.float32(1e-4)  # close to its base: stored as delta chunks, which need the base
    b = {"w": w}
    tpde.numpy.save_file({"w": a["w"] + 1}, tmp_path / "other.tpde")
    tpde.numpy.save_file(b, tmp_path / "delta.tpde", base=good)
    assert kind_of(tmp_path / "delta.tpde", base=tmp_path / "other.tpde") == "base-mismatch"
    os.remove(good)
    assert kind_of(tmp_path / "delta.tpde") == "base-missing"


def test_bad_arguments(tmp_path):
    with pytest.raises(tpde.TpdeError) as e:
        tpde.numpy.save_file({"a": np.zeros(2, np.complex64)}, tmp_path / "x.tpde")
    assert "complex64" in str(e.value)
    with pytest.raises(tpde.TpdeError) as e:
        tpde.numpy.save_file({"a": np.zeros(2)}, tmp_path / "x.tpde", codec="lz77")
    assert e.value.kind == "invalid-argument"
    with pytest.raises(tpde.TpdeError) as e:
        tpde.numpy.save_file({"a": np.zeros(2)}, tmp_path / "x.tpde", metadata={"tpde.step": "1"})
    assert "reserved" in str(e.value)
    with pytest.raises(tpde.TpdeError):
        tpde.safe_open(tmp_path / "x.tpde", framework="jax")
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir()), "a failed save leaves nothing"


def test_version_matches_the_crates():
    import re

    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "Cargo.toml")
    with open(root) as f:
        text = f.read()
    version = re.search(r'\[workspace\.package\][^\[]*?version = "([^"]+)"', text).group(1)
    assert tpde.__version__ == version


def test_load_into_decodes_in_place_bit_exact(tmp_path):
    # Every dtype, a delta through its base, a tied pair, a strided destination and an empty
    # tensor: the destinations' own memory holds the file's bits afterwards.
    first = {f"t{i}": torch.from_numpy(random_array(np.uint8, (33, 17 * 8))).view(dt).clone()
             for i, dt in enumerate(TORCH_DTYPES)}
    first["big"] = torch.randn(300, 700)
    first["empty"] = torch.empty(0, 5)
    second = {k: (v + 1e-3 if v.dtype == torch.float32 else v) for k, v in first.items()}
    base, delta = tmp_path / "a.tpde", tmp_path / "b.tpde"
    tpde.torch.save_file(first, base)
    tpde.torch.save_file(second, delta, base=base)
    dst = {k: torch.zeros_like(v) for k, v in second.items()}
    pointers = {k: v.data_ptr() for k, v in dst.items()}
    strided = torch.zeros(700, 300).t()  # not contiguous: decoded, then copied in
    dst["big"] = strided
    assert tpde.torch.load_into(delta, dst) == ([], [])
    for k, v in second.items():
        assert torch_bytes(dst[k]) == torch_bytes(v), k
    assert all(dst[k].data_ptr() == p for k, p in pointers.items() if k != "big"), "decoded in place"
    assert torch_bytes(strided) == torch_bytes(second["big"])
    # Tied: two names, one storage, decoded once.
    w = torch.randn(64, 8)
    tpde.torch.save_file({"emb": w, "head": w}, tmp_path / "tied.tpde")
    shared = torch.zeros(64, 8)
    tpde.torch.load_into(tmp_path / "tied.tpde", {"emb": shared, "head": shared})
    assert torch.equal(shared, w)


def test_load_into_refuses_what_does_not_fit(tmp_path):
    path = tmp_path / "m.tpde"
    tpde.torch.save_file({"a": torch.ones(4, 4), "b": torch.ones(3)}, path)
    for wrong in [torch.zeros(4, 5), torch.zeros(4, 4, dtype=torch.float64)]:
        with pytest.raises(tpde.TpdeError) as e:
            tpde.torch.load_into(path, {"a": wrong, "b": torch.zeros(3)})
        assert e.value.kind == "invalid-argument" and "'a'" in str(e.value)
    with pytest.raises(tpde.TpdeError) as e:
        tpde.torch.load_into(path, {"a": torch.zeros(4, 4), "c": torch.zeros(1)})
    assert e.value.kind == "invalid-argument" and "'c'" in str(e.value) and "'b'" in str(e.value)
    a = torch.zeros(4, 4)
    assert tpde.torch.load_into(path, {"a": a, "c": torch.zeros(1)}, strict=False) == (["c"], ["b"])
    assert torch.equal(a, torch.ones(4, 4))
    # Overlapping destinations (not one tied storage): refused, not written twice at once.
    storage = torch.zeros(20)
    with pytest.raises(tpde.TpdeError) as e:
        tpde.torch.load_into(path, {"a": storage[:16].view(4, 4), "b": storage[14:17]})
    assert e.value.kind == "invalid-argument"


CTRL_C = """
import os, signal, sys, threading, torch, tpde.torch
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in an interactive session
state = {f"t{i}": torch.randn(16 << 20) for i in range(16)}  # 1 GiB: seconds to encode
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, mid-save
try:
    tpde.torch.save_file(state, sys.argv[1])
    print("saved")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_ctrl_c_stops_a_long_save_and_leaves_nothing(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "big.tpde"
    r = subprocess.run([sys.executable, "-c", CTRL_C, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # Before: the save ran to its end with the GIL released, the file appeared, and only then
    # did KeyboardInterrupt come.
    assert r.stdout.strip() == "interrupted", r.stdout + r.stderr
    assert list(tmp_path.iterdir()) == []


def test_pip_install_brings_the_command_line(tmp_path):
    """`pip install` puts `tpde` and `tpde-inspect` beside the interpreter: the Rust command line,
    compiled into the extension."""
    import json
    import shutil
    import subprocess
    import sys

    bindir = os.path.dirname(sys.executable)
    exe = {name: shutil.which(name, path=bindir) for name in ("tpde", "tpde-inspect")}
    assert all(exe.values()), f"no console scripts in {bindir}: {exe}"
    tpde.numpy.save_file({"w": np.arange(1000, dtype=np.float32)}, tmp_path / "a.tpde")
    run = lambda *args: subprocess.run(args, capture_output=True, text=True, timeout=120)  # noqa: E731
    r = run(exe["tpde"], "verify", str(tmp_path / "a.tpde"))
    assert r.returncode == 0 and r.stdout.startswith("ok: 1 tensors"), r
    r = run(exe["tpde-inspect"], "--json", str(tmp_path / "a.tpde"))
    assert r.returncode == 0 and json.loads(r.stdout)["tensors"][0]["name"] == "w", r
    r = run(exe["tpde"], "inspect", str(tmp_path / "missing.tpde"))
    assert r.returncode == 1 and "missing.tpde" in r.stderr, r
    r = run(exe["tpde"], "no-such-command")
    assert r.returncode == 2, r
    r = run(exe["tpde"], "bench-gpu")  # the pip build leaves the GPU decoder out, and says so
    assert r.returncode == 2 and "cargo install --path crates/tpde-cli" in r.stderr, r

#!/usr/bin/env bash
# The GPU decoder and the CUDA loads on a real GPU, in one short command: bit-exactness on the
# driver, then speed.
#
#   tools/gpu-check.sh --prepare  here: build what the GPU machine needs into target/gpu-check/
#                                 (ignored; stripped binaries and the Vulkan loader's package)
#   tools/gpu-check.sh            on the GPU machine (no network, no Rust): results under $OUT
#   tools/gpu-check.sh --local    here, on whatever adapter there is (lavapipe in CI), with the
#                                 small demo checkpoint: what CI runs so that the check never rots
#
# On the GPU machine it refuses CPU adapters (TPDE_GPU_ADAPTER=hardware): a check that fell back
# to lavapipe would measure a CPU and call it a GPU. Every step runs even if one before failed;
# the exit status says whether all passed. docs/measurements.md records what it found.
set -uo pipefail
cd "$(dirname "$0")/.."
kit=target/gpu-check
mode=${1:-gpu}

prepare() {
  set -e
  echo "== building tpde and the GPU crate's tests (release)"
  cargo build --release --locked --bin tpde
  local tests
  tests=$(cargo test --release --locked -p tpde-gpu --test gpu --no-run --message-format=json \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')
  cargo build --release --locked -p tpde-gpu --example layers
  rm -rf "$kit" && mkdir -p "$kit/bin" "$kit/deb"
  strip -o "$kit/bin/tpde" target/release/tpde
  strip -o "$kit/bin/tpde-gpu-tests" "$tests"
  strip -o "$kit/bin/layers" target/release/examples/layers
  echo "== the Python extension, one abi3 wheel (the GPU machine's image has torch, numpy, ml_dtypes,"
  echo "   safetensors and pytest; the tests and the benchmark travel with the working tree)"
  local maturin=target/pyenv/bin/maturin
  [ -x "$maturin" ] || maturin=$(command -v maturin || true)
  if [ -n "$maturin" ]; then
    "$maturin" build --release --locked -q -m crates/tpde-py/Cargo.toml -o "$kit/wheels"
  else # CI's --local check needs no wheel; it prepares before its virtualenv exists
    echo "no maturin (pip install maturin, or tools/test.sh's target/pyenv): the CUDA steps will be skipped"
  fi
  echo "== the Vulkan loader, as a Debian package to unpack where the machine lacks one"
  # The NVIDIA driver brings its own Vulkan driver (libGLX_nvidia); the loader is a separate
  # package that a machine set up for CUDA alone may lack.
  (cd "$kit/deb" && { apt-get download libvulkan1 2>/dev/null || { apt-get update -qq && apt-get download libvulkan1; }; })
  du -sh "$kit"
  set +e
}

failed=()
# step NAME FILE COMMAND...: runs the command, its output shown and kept in FILE.
step() {
  local name=$1 file=$2
  shift 2
  echo
  echo "== $name: $*"
  if ! "$@" 2>&1 | tee "$file"; then
    failed+=("$name")
    echo "== $name FAILED"
  fi
}

# Makes the Vulkan loader and NVIDIA's Vulkan driver findable when the machine has them only in
# part (a container set up for CUDA: the driver's libraries, no ICD file, maybe no loader).
vulkan_setup() {
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
    local deb
    deb=$(ls "$kit"/deb/libvulkan1_*.deb 2>/dev/null | head -n 1)
    if [ -n "$deb" ]; then
      mkdir -p "$kit/vulkan"
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$kit/vulkan"
      else # a .deb is an ar archive holding data.tar.*
        (deb="$PWD/$deb" && cd "$kit/vulkan" && ar x "$deb" && tar xf data.tar.*)
      fi
      export LD_LIBRARY_PATH="$PWD/$kit/vulkan/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
      echo "Vulkan loader: unpacked from $deb"
    else
      echo "Vulkan loader: none installed and none prepared (run --prepare first)"
    fi
  fi
  # NVIDIA's Vulkan driver has two entry points: libGLX_nvidia (the usual ICD file's) needs a
  # display and, headless, fails with "Could not get 'vkCreateInstance'" (seen on an H100
  # container, driver 580); libEGL_nvidia is the headless one. With no display, use EGL's.
  local lib=
  for name in libEGL_nvidia.so.0 libGLX_nvidia.so.0; do
    [ -z "${DISPLAY:-}" ] || [ "$name" = libGLX_nvidia.so.0 ] || continue
    lib=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')
    [ -n "$lib" ] || lib=$(ls /usr/lib/x86_64-linux-gnu/$name /usr/lib64/$name /usr/lib/$name 2>/dev/null | head -n 1)
    [ -z "$lib" ] || break
  done
  if [ -n "$lib" ]; then
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' "$lib" \
      > "$kit/nvidia_icd.json"
    export VK_DRIVER_FILES="$PWD/$kit/nvidia_icd.json" VK_ICD_FILENAMES="$PWD/$kit/nvidia_icd.json"
    echo "NVIDIA Vulkan driver: $lib"
  else
    echo "NVIDIA Vulkan driver: neither libEGL_nvidia.so.0 nor libGLX_nvidia.so.0 (a driver installed for compute only?)"
  fi
}

check() {
  local out=$1 demo_mb=$2 runs=$3
  mkdir -p "$out"
  local bin=$kit/bin
  if [ ! -x "$bin/tpde" ] || [ ! -x "$bin/tpde-gpu-tests" ]; then
    echo "no prepared binaries under $bin: run tools/gpu-check.sh --prepare first" >&2
    exit 2
  fi
  {
    echo "commit: $(cat "$kit/commit" 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "date: $(date -u +%FT%TZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) threads)"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory,pcie.link.gen.max,pcie.link.width.max \
        --format=csv
    fi
  } 2>&1 | tee "$out/machine.txt"
  command -v nvidia-smi >/dev/null && nvidia-smi -q > "$out/nvidia-smi.txt" 2>&1
  step "conformance corpus on the GPU" "$out/conformance.txt" "$bin/tpde" conformance conformance --gpu
  step "GPU crate tests" "$out/tests.txt" "$bin/tpde-gpu-tests"
  # The Rust example: a delta's layers into wgpu buffers, each used by a kernel of its own.
  rm -rf "$kit/demo"
  step "layer example" "$out/layers.txt" sh -c "\"$bin/tpde\" demo --dir \"$kit/demo\" >/dev/null &&
    \"$bin/layers\" \"$kit/demo/packed/step000060.tpde\""
  # Issue 56's rows: each size decade up to 1 GB there (1 MB here), kernels alone, CPU reader.
  local sized=() decades=1
  [ "$demo_mb" = 0 ] || { sized=(--demo-mb "$demo_mb"); decades=1024; }
  step "bench-gpu" "$out/bench.txt" "$bin/tpde" bench-gpu "${sized[@]}" --runs "$runs" --decades "$decades"
  if [ "$mode" = gpu ]; then
    # torch's loads onto CUDA (issue 57): the extension from the kit, over the image's torch.
    local wheel
    wheel=$(ls "$kit"/wheels/tpde-*.whl 2>/dev/null | head -n 1)
    if [ -n "$wheel" ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$kit/site" "$wheel"; then
      export PYTHONPATH="$PWD/$kit/site${PYTHONPATH:+:$PYTHONPATH}"
      step "CUDA tests" "$out/cuda-tests.txt" python3 -m pytest -q -p no:cacheprovider -rs \
        crates/tpde-py/tests/test_device_loads.py
      step "CUDA loads" "$out/cuda-loads.txt" env PYTHONUNBUFFERED=1 python3 tools/bench/cuda_loads.py \
        --mb "$demo_mb" --runs "$runs" --dir /tmp/tpde-cuda-loads
      rm -rf /tmp/tpde-cuda-loads
    else
      failed+=("CUDA loads (no wheel in $kit/wheels: run --prepare)")
    fi
  fi
  echo
  if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu-check: FAILED: ${failed[*]}"
    return 1
  fi
  echo "gpu-check: all passed; results in $out"
}

case "$mode" in
  --prepare)
    prepare
    git rev-parse HEAD > "$kit/commit" 2>/dev/null || true
    ;;
  --local)
    # The machine's own adapter, whatever it is (CI: lavapipe), and the small demo checkpoint.
    check "$kit/local" 0 1
    ;;
  gpu)
    export TPDE_GPU_ADAPTER=hardware
    vulkan_setup
    # At least 1 GB of tensors, generated there; 3 timed runs of each row.
    check "${OUT:-$kit/out}" 1000 3
    ;;
  *)
    echo "usage: tools/gpu-check.sh [--prepare | --local]" >&2
    exit 2
    ;;
esac

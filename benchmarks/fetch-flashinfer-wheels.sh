#!/usr/bin/env bash
# FlashInfer for the GPU machine (flashinfer-python 0.7.4, x86-64, Python 3.12): its one 101 MB wheel split over
# two transfers, DEST/c and DEST/d (default DEST .gpu-wheels), after ../shared/gpu/fetch-peer-wheels.sh's a and b
# (flash-attn-4's CUTLASS DSL and tvm-ffi, which FlashInfer's CuTe DSL kernels use; the image has its other
# imports). On the machine, `source DEST/d/device-install.sh` joins the halves and installs into /tmp/peers.
# Run from the repo root.
set -euo pipefail
DEST=${1:-.gpu-wheels}
mkdir -p "$DEST/c" "$DEST/d" "$DEST/.fi"
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d "$DEST/.fi" flashinfer-python==0.7.4
wheel=$(ls "$DEST"/.fi/flashinfer_python-*.whl)
split -b 52M "$wheel" "$DEST/.fi/fi.part."
mv "$DEST"/.fi/fi.part.aa "$DEST/c/"
mv "$DEST"/.fi/fi.part.ab "$DEST/d/"
basename "$wheel" > "$DEST/d/fi.name"
cat > "$DEST/d/device-install.sh" <<'INSTALL'
# joins .gpu-wheels/c and .gpu-wheels/d into FlashInfer's wheel and installs it into /tmp/peers
here=$(dirname "${BASH_SOURCE[0]}")
wheel=/tmp/$(cat "$here/fi.name")
cat "$here/../c/fi.part.aa" "$here/fi.part.ab" > "$wheel"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers "$wheel" && echo "flashinfer installed"
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws
INSTALL
rm -rf "$DEST/.fi"
du -sh "$DEST/c" "$DEST/d"

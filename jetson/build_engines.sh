#!/usr/bin/env bash
# Build a bundle's TensorRT engines ON THE JETSON (engines are tied to the GPU and TensorRT release).
# Usage: jetson/build_engines.sh /opt/spotstop/bundle
# Runs the bundle's trt/build.sh (the exact trtexec commands `spotstop export` wrote) with the
# device's trtexec, or inside the L4T JetPack container, which ships trtexec at
# /usr/src/tensorrt/bin/trtexec and python3 (for the engine record). Networks are strongly typed
# (TensorRT 10: --stronglyTyped; 11: always); the precision comes from the exported graphs.
# Each member gets members/<name>/trt/*.plan and members/<name>/trt/engines.yaml (TensorRT
# version, GPU, sha256 of the graphs and engines), which `spotstop serve --backend tensorrt` checks.
set -euo pipefail
BUNDLE="$(realpath "${1:?usage: $0 BUNDLE_DIR}")"
IMAGE="${IMAGE:-nvcr.io/nvidia/l4t-jetpack:r36.4.0}"
[ -f "$BUNDLE/trt/build.sh" ] || { echo "$BUNDLE/trt/build.sh missing: export with --trt script" >&2; exit 2; }
if command -v trtexec >/dev/null 2>&1 || [ -x /usr/src/tensorrt/bin/trtexec ]; then
  TRTEXEC="$(command -v trtexec || echo /usr/src/tensorrt/bin/trtexec)" bash "$BUNDLE/trt/build.sh"
else
  docker run --rm --runtime nvidia -v "$BUNDLE:/bundle" "$IMAGE" \
    env TRTEXEC=/usr/src/tensorrt/bin/trtexec bash /bundle/trt/build.sh
fi
echo "engines and their records (members/*/trt/engines.yaml) written under $BUNDLE/members/;"
echo "they are built per device and checked by the engine record, not the manifest's sha256 list."
echo "serve them with: spotstop serve --bundle $BUNDLE --backend tensorrt --device cuda"

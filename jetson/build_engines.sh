#!/usr/bin/env bash
# Build a bundle's TensorRT engines ON THE JETSON (engines are tied to the GPU and TensorRT version).
# Usage: jetson/build_engines.sh /opt/spotstop/bundle
# Runs the bundle's trt/build.sh (the exact trtexec commands `spotstop export` wrote) inside the
# L4T JetPack container, which ships trtexec at /usr/src/tensorrt/bin/trtexec.
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
echo "engines written under $BUNDLE/trt/ (not part of the manifest's sha256 list: they are built per device)"

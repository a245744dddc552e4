#!/usr/bin/env bash
# Builds what the 16-core check runs on the lent machine (no Rust toolchain, no network
# there) into .cores/ (git-ignored, stripped):
#   .cores/tickserve          the server (release)
#   .cores/tickserve-bench    the per-tick harness (release)
#   .cores/perf_analyzer-*.whl  Triton's perf_analyzer (manylinux_2_38: runs natively there)
#   .cores/BUILD              the commit built and the highest glibc symbol needed
# and .pack/cores.tar.xz (.cores and the ONNX Runtime library, packed to fit the carry).
# Then carry .pack/cores.tar.xz and run scripts/device/cores_check.sh (it unpacks it)
# there (after scripts/gpu_check.sh: the GPU check comes first).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .cores
cargo build --release --locked -p tickserve-server -p tickserve-bench
for b in tickserve tickserve-bench; do
  cp "target/release/$b" ".cores/$b"
  strip ".cores/$b"
done
if ! ls .cores/perf_analyzer-*.whl >/dev/null 2>&1; then
  if ls .gpu/perf_analyzer-*.whl >/dev/null 2>&1; then
    cp .gpu/perf_analyzer-*.whl .cores/
  else
    python3 -m pip download -q --no-deps --only-binary=:all: \
      --platform manylinux_2_38_x86_64 perf-analyzer==2.60.0 -d .cores
  fi
fi
scripts/device/pack_bundle.sh cores .cores .cores/tickserve .cores/tickserve-bench

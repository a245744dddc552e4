#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain and no network)
# into .gpu/ (git-ignored, stripped, under the device tool's 64 MiB carry):
#   .gpu/tickserve                 the server (release)
#   .gpu/gpu-engine, .gpu/gpu-runtime   the --ignored GPU tests (release)
#   .gpu/graph_replay              the graph replay benchmark
# Carry .gpu and .local/lib/libonnxruntime.so.1.31.1, then run scripts/gpu_run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
exe() { # the test/bench executable cargo reports for a target
  cargo "$@" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] is not None:
        print(m["executable"])' | tail -1
}
cargo build --release -p tickserve-server
cp target/release/tickserve .gpu/tickserve
cp "$(exe test --release -p tickserve-engine-cuda --test gpu)" .gpu/gpu-engine
cp "$(exe test --release -p tickserve-runtime --test runtime)" .gpu/gpu-runtime
cp "$(exe bench -p tickserve-engine-cuda --bench graph_replay)" .gpu/graph_replay
strip .gpu/*
du -ch .gpu/* .local/lib/libonnxruntime.so.1.31.1 | tail -1

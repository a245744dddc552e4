#!/usr/bin/env bash
# The compiled CPU engine beside ONNX Runtime, in one run: the per-tick benchmark's tree
# ensemble and LSTM (scripts/dev/make_models.py --bench) and an MLP (config/models/alpha_mlp),
# served with runtime.cpu_engine = "onnxruntime", then with "auto" (the compiled engine),
# one instance over shared memory each. tickserve-bench's "ONNX Runtime direct" column is
# ONNX Runtime called in the harness on the same ticks: the floor the engines are held to.
#
#   scripts/bench/bench_engines.sh [TICKS]      # default 10000 ticks after 1000 of warm-up
#
# LATENCY=1 runs each server in the latency mode (docs/shm.md#latency-mode): its one
# shared-memory thread pinned to the last core, polling for ever, the one-row tick run on
# it; tickserve-bench pinned to core 0 (`taskset`), polling for its answer for ever.
#
# Needs the release build: cargo build --release -p tickserve-server -p tickserve-bench
set -euo pipefail
cd "$(dirname "$0")/../.."
ticks=${1:-10000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python scripts/dev/make_models.py --bench "$work/models"
cp -r config/models/alpha_mlp "$work/models/"
library=$PWD/.local/lib/libonnxruntime.so.1.31.1
export TICKSERVE_ONNXRUNTIME_LIBRARY=$library WORK=$work TICKS=$ticks
client=(target/release/tickserve-bench)
latency=""
if [ "${LATENCY:-0}" = 1 ]; then
  last=$(($(nproc) - 1))
  latency=$(printf 'threads = 1\n[latency]\ncores = [%s]\n' "$last")
  client=(taskset -c 0 target/release/tickserve-bench --client-spin 1s)
fi
export CLIENT="${client[*]}"
for engine in onnxruntime auto; do
  printf '[repository]\npath = "%s"\n[runtime]\nonnxruntime_library = "%s"\ncpu_engine = "%s"\n[shm]\nenabled = true\nservice = "tickserve-engines-%s"\n%s\n' \
    "$work/models" "$library" "$engine" "$engine" "$latency" >"$work/$engine.toml"
  ENGINE=$engine python3 scripts/bench/server.py --config "$work/$engine.toml" -- bash -c '
    for model in bench_trees bench_lstm alpha_mlp; do
      echo "== cpu_engine = $ENGINE, $model"
      $CLIENT --repository "$WORK/models" --model "$model" \
        --service "tickserve-engines-$ENGINE" --grpc "http://127.0.0.1:$TICKSERVE_GRPC_PORT" \
        --ticks "$TICKS" --warmup 1000
    done'
done

#!/usr/bin/env bash
# Monte Carlo's cost, in one run: perf_analyzer (gRPC, concurrency 1) on alpha_mlp with a
# one-row request, then the same row with mc_samples = 64 (sigma 0.1, seeded), against a
# release build started here. The seed recipe's way — 64 model calls in a loop — costs
# 64 one-row requests: 64 × the first row's latency. Prints a Markdown table; raw
# outputs go to target/bench/.
#
#   cargo build --release -p tickserve-server && scripts/bench/bench_monte_carlo.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/bench
pa=../shared/tools/perf_analyzer
mkdir -p "$out"
if [ "${1:-}" = --clients ]; then
  url=127.0.0.1:$TICKSERVE_GRPC_PORT
  run() {  # name, extra perf_analyzer arguments
    local name=$1; shift
    "$pa" -m alpha_mlp -u "$url" -i grpc --concurrency-range 1 --measurement-interval 5000 \
      -f "$out/mc_$name.csv" "$@" > "$out/mc_$name.txt" 2>&1
  }
  run one_row
  run mc64 --request-parameter mc_samples:64:int --request-parameter mc_noise_sigma:0.1:string \
    --request-parameter mc_seed:7:int
  python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
rows = {}
for name in ("one_row", "mc64"):
    r = next(csv.DictReader(open(f"{out}/mc_{name}.csv")))
    rows[name] = (float(r["Inferences/Second"]), float(r["p50 latency"]), float(r["p99 latency"]))
base = rows["one_row"]
print("| request | inferences/s | p50 (µs) | p99 (µs) | p50 vs one row |")
print("| --- | ---: | ---: | ---: | ---: |")
print(f"| one row | {base[0]:.0f} | {base[1]:.0f} | {base[2]:.0f} | 1.00× |")
mc = rows["mc64"]
print(f"| one row, mc_samples = 64 | {mc[0]:.0f} | {mc[1]:.0f} | {mc[2]:.0f} | {mc[1] / base[1]:.2f}× |")
print(f"| 64 one-row requests in a loop (64 × one row) | {base[0] / 64:.0f} | {64 * base[1]:.0f} | — | 64.00× |")
PY
  exit 0
fi
python3 scripts/bench/server.py -- "$0" --clients

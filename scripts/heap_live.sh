#!/usr/bin/env bash
# The server's live heap after a stated load, with heaptrack (apt-get install
# heaptrack): starts the release build under heaptrack, sends RATE gRPC
# requests/s (k6, the steady scenario) for SECONDS, then kills the server with
# SIGKILL so that everything still allocated counts as "leaked", and prints
# heaptrack's summary. Two runs of different lengths tell whether the live heap
# grows with the number of requests:
#
#   cargo build --release -p tickserve-server
#   scripts/heap_live.sh short 40 2000 && scripts/heap_live.sh long 120 2000
#   heaptrack_print -f target/heaptrack/long.zst -d target/heaptrack/short.zst --print-leaks 1
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?name} seconds=${2:?seconds} rate=${3:-2000}
out=target/heaptrack
mkdir -p "$out"
rm -f "$out/$name.zst"
heaptrack -o "$out/$name" target/release/tickserve serve --config config/tickserve.toml \
  --http-port 18000 --grpc-port 18001 > "$out/$name.log" 2>&1 &
for _ in $(seq 1 100); do
  curl -sf http://127.0.0.1:18000/v2/health/ready >/dev/null && break
  sleep 0.2
done
.venv/bin/k6 run -q --no-summary --no-thresholds -e SCENARIO=steady -e RATE="$rate" \
  -e DURATION="${seconds}s" -e TICKSERVE_GRPC=127.0.0.1:18001 loadtest/grpc.js > /dev/null 2>&1 || true
curl -s http://127.0.0.1:18000/metrics | grep -E '^tickserve_requests_total' || true
kill -KILL "$(pgrep -f 'release/tickserve serve --config config/tickserve.toml --http-port 18000' | tail -1)"
for _ in $(seq 1 100); do [ -s "$out/$name.zst" ] && ! pgrep -f "heaptrack.*$out/$name" >/dev/null && break; sleep 0.2; done
heaptrack_print -f "$out/$name.zst" --print-peaks 0 --print-leaks 0 --print-allocators 0 \
  --print-temporary 0 2>/dev/null | grep -E 'runtime|leaked|peak heap'

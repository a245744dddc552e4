#!/usr/bin/env bash
# The server's live heap after a stated load, with heaptrack (apt-get install
# heaptrack): starts a release build under heaptrack, sends RATE requests/s (k6, the
# steady scenario, split over PROTOCOLS: grpc, http or http,grpc) for SECONDS, printing
# the server's RSS every 30 s, then kills the server with SIGKILL so that everything
# still allocated counts as "leaked", and prints heaptrack's summary. Two runs of
# different lengths tell whether the live heap grows with the number of requests:
#
#   cargo build --release -p tickserve-server --no-default-features   # glibc's malloc:
#   cp target/release/tickserve target/glibc-tickserve                # heaptrack can't see jemalloc
#   TICKSERVE_BIN=target/glibc-tickserve scripts/dev/heap_live.sh short 40 2000
#   TICKSERVE_BIN=target/glibc-tickserve scripts/dev/heap_live.sh long 120 2000
#   heaptrack_print -f target/heaptrack/long.zst -d target/heaptrack/short.zst --print-leaks 1
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?name} seconds=${2:?seconds} rate=${3:-2000} protocols=${4:-grpc}
bin=${TICKSERVE_BIN:-target/release/tickserve}
out=target/heaptrack
mkdir -p "$out"
rm -f "$out/$name.zst"
heaptrack -o "$out/$name" "$bin" serve --config config/tickserve.toml \
  --http-port 18000 --grpc-port 18001 > "$out/$name.log" 2>&1 &
for _ in $(seq 1 100); do
  curl -sf http://127.0.0.1:18000/v2/health/ready >/dev/null && break
  sleep 0.2
done
n=$(echo "$protocols" | tr ',' '\n' | wc -l)
clients=()
for protocol in ${protocols//,/ }; do
  address=127.0.0.1:18001; [ "$protocol" = http ] && address=http://127.0.0.1:18000
  .venv/bin/k6 run -q --no-summary --no-thresholds -e SCENARIO=steady -e RATE=$((rate / n)) \
    -e DURATION="${seconds}s" -e "TICKSERVE_${protocol^^}=$address" "loadtest/$protocol.js" \
    > /dev/null 2>&1 &
  clients+=($!)
done
started=$(date +%s)
while kill -0 "${clients[0]}" 2>/dev/null; do
  sleep 30
  rss=$(curl -s http://127.0.0.1:18000/metrics | awk '/^tickserve_process_resident_memory_bytes/ {printf "%.2f", $2 / 1048576}')
  echo "$(( $(date +%s) - started )) s: RSS ${rss} MiB"
done
wait "${clients[@]}" || true
curl -s http://127.0.0.1:18000/metrics | grep -E '^tickserve_requests_total' || true
kill -KILL "$(pgrep -f "$bin serve --config config/tickserve.toml --http-port 18000" | tail -1)"
for _ in $(seq 1 100); do [ -s "$out/$name.zst" ] && ! pgrep -f "heaptrack.*$out/$name" >/dev/null && break; sleep 0.2; done
heaptrack_print -f "$out/$name.zst" --print-peaks 0 --print-leaks 0 --print-allocators 0 \
  --print-temporary 0 2>/dev/null | grep -E 'runtime|leaked|peak heap'

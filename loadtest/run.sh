#!/usr/bin/env bash
# Runs one k6 scenario against a release build of tickserve started here, over HTTP
# and gRPC (or the protocols named), and writes the k6 summaries and a Markdown table
# to loadtest/results/. Exits non-zero if a scenario's thresholds fail.
#
#   loadtest/run.sh steady                 # both protocols, RATE=1000 for 30 s
#   RATE=1500 DURATION=20s loadtest/run.sh steady http
#   loadtest/run.sh ramp                   # 100 → 8000 requests/s: find the knee
#   loadtest/run.sh spike                  # RATE, 4 × RATE, RATE
#   loadtest/run.sh family                 # RATE spread over tick_000..tick_007
#
# Scenarios: lib/scenarios.js. Env passed to k6: RATE, MAX_RATE, DURATION, VUS.
# Server and k6 share this machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:?usage: loadtest/run.sh SCENARIO [http|grpc ...]}"
shift
protocols=("${@:-http}")
[ $# -gt 0 ] || protocols=(http grpc)
scripts/setup.sh
cargo build --release --locked -p tickserve-server
results=loadtest/results
mkdir -p "$results"
http=18280 grpc=18281

target/release/tickserve serve --config config/tickserve.toml --http-port $http --grpc-port $grpc \
  > "$results/$scenario-server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "127.0.0.1:$http/v2/health/ready" >/dev/null && break; sleep 0.2; done

status=0
for protocol in "${protocols[@]}"; do
  summary="$results/$scenario-$protocol.json"
  if .venv/bin/k6 run -q -e SCENARIO="$scenario" -e TICKSERVE_HTTP="http://127.0.0.1:$http" \
      -e TICKSERVE_GRPC="127.0.0.1:$grpc" -e RATE="${RATE:-1000}" -e MAX_RATE="${MAX_RATE:-8000}" \
      -e DURATION="${DURATION:-30s}" -e VUS="${VUS:-1}" --summary-export "$summary" \
      "loadtest/$protocol.js" > "$results/$scenario-$protocol.txt" 2>&1; then
    echo "$scenario over $protocol: thresholds passed" >&2
  else
    echo "$scenario over $protocol: thresholds FAILED (see $results/$scenario-$protocol.txt)" >&2
    status=1
  fi
done

.venv/bin/python - "$results" "$scenario" "${protocols[@]}" <<'PY' | tee "$results/$scenario.md"
import json, os, sys
results, scenario, protocols = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"| scenario | protocol | requests/s | p50 (µs) | p99 (µs) | max (µs) | shed | errors |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for p in protocols:
    m = json.load(open(os.path.join(results, f"{scenario}-{p}.json")))["metrics"]
    d = m["answered_duration" if p == "http" else "grpc_req_duration"]
    us = lambda k: f"{d[k] * 1000:.0f}"
    rate = m["iterations"]["rate"]
    shed = m.get("shed", {}).get("value", 0)
    errors = m.get("errors", {}).get("value", 0)
    print(f"| {scenario} | {p} | {rate:.0f} | {us('med')} | {us('p(99)')} | {us('max')} | {shed:.2%} | {errors:.2%} |")
PY
exit $status

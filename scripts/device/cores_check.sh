#!/usr/bin/env bash
# The 16-core check: what the 2-core development machine cannot measure, because there
# its server and its clients share two cores. Run on a machine with 16 cores and nothing
# else running (the lent GPU machine, after scripts/gpu_check.sh), the server pinned to
# cores 0-7 and every client to 8-15 (taskset), each step under its own timeout, the whole
# under CORES_CHECK_SECONDS (360); figures in $OUT/summary.md, rewritten after every step
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
# yielding (--client-spin 0s), shm.gather on (2b) and off (2c); 3 the other models and gRPC at
# one instance (the tree ensemble, the 100-tick window, the LSTM over gRPC); 4 sparse
# ticks (one every 10 ms, 100 ms, 1 s, open loop) with keep_warm off and on; 5 batching at
# concurrency 32 (perf_analyzer, gRPC, alpha_mlp): batched against unbatched.
# Needs Python 3 with numpy and onnx (the models): TICKSERVE_PYTHON, else
# /opt/torch/.venv/bin/python, else .venv/bin/python, else python3.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
# begin, and step NAME SECONDS LOG COMMAND...: scripts/device/check_steps.sh.
. scripts/device/check_steps.sh
# The bundle travels packed (scripts/device/cores_bundle.sh).
begin cores "${CORES_CHECK_SECONDS:-360}"
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
  cat $bin/BUILD 2>/dev/null || echo "no $bin/BUILD: run scripts/device/cores_bundle.sh here first"
} >"$OUT/env.log" 2>&1
echo "| 1. machine | ok | 0 s | env.log |" >>"$steps"
write_summary

library=$root/.local/lib/libonnxruntime.so.1.31.1
export TICKSERVE_ONNXRUNTIME_LIBRARY=$library
"$py" scripts/dev/make_models.py --bench "$work/models" >"$OUT/models.log" 2>&1
# config NAME EXTRA: a server configuration on the benchmark models, shared memory on.
config() {
  local name=$1 extra=${2:-}
  printf '[repository]\npath = "%s"\n[runtime]\nonnxruntime_library = "%s"\n[shm]\nenabled = true\nservice = "tickserve-cores-%s"\n[model_defaults]\n%s\n' \
    "$3" "$library" "$name" "$extra" >"$work/$name.toml"
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
# CORES_STEPS: which of steps 2-5 run (all by default), e.g. CORES_STEPS="2 5".
wanted() { [[ " ${CORES_STEPS:-2 3 4 5} " == *" $1 "* ]]; }
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

others() {
  "$h" tickserve-cores-plain "bench_trees, shm, 1 instance" --model bench_trees --ticks 5000 --warmup 500
  "$h" tickserve-cores-plain "bench_trees, gRPC, 1 instance" --model bench_trees --ticks 5000 --warmup 500 --transport grpc
  "$h" tickserve-cores-plain "bench_lstm, gRPC, 1 instance" --model bench_lstm --ticks 5000 --warmup 500 --transport grpc
  "$h" tickserve-cores-plain "bench_lstm_window, shm, 1 instance" --model bench_lstm_window --ticks 1000 --warmup 100
}
export -f others
wanted 3 && step "3. the tree ensemble, the window, gRPC" 90 others.log "$serve" "$plain" bash -c others

sparse() { # SERVICE LABEL
  for spacing in "10ms 300" "100ms 40" "1s 8"; do
    set -- $spacing
    "$h" "tickserve-cores-$SPARSE" "bench_lstm, a tick every $1, $SPARSE" --model bench_lstm \
      --ticks "$2" --warmup 20 --interval "$1"
  done
}
export -f sparse
wanted 4 && step "4a. sparse ticks, keep_warm off" 60 sparse.log "$serve" "$plain" env SPARSE=plain bash -c sparse
wanted 4 && step "4b. sparse ticks, keep_warm = 1ms" 60 sparse.log "$serve" "$warm" env SPARSE=warm bash -c sparse

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
write_summary
cat "$OUT/summary.md"

#!/usr/bin/env bash
# The GPU check: one command on the GPU machine that returns every figure the GPU half
# of tickserve needs, each step under its own timeout, the whole under GPU_CHECK_SECONDS
# (540), a partial run still leaving its figures. Everything it writes is under $OUT
# (8 files, what the device tool returns): summary.md, env.log, engine.log, replay.log,
# e2e.log, families.log, sequences.log (the LSTM step of step 9 too), mem.csv.
#
# Here, first (builds .gpu/, then a dry run: the GPU steps fail fast, the server phases
# run on the CPU):
#   scripts/gpu_bundle.sh && OUT=/tmp/dry bash scripts/gpu_check.sh
# There (the device tool, carry [".pack/gpu.tar.xz"]: .gpu and the ONNX Runtime library, packed):
#   bash scripts/gpu_check.sh
#
# Steps: 1 machine and libraries, 2 `tickserve check`, 3 correctness against ONNX Runtime
# on the CPU (engine tests, then every GPU model through the server at 1..64 and 3, 5, 13,
# 33, 65 rows), 4 graph replay per bucket, 5 perf_analyzer gRPC and HTTP at c1 and c16 on
# gpu:0 and on the CPU, 6 a family of 128 members under 16 clients, 7 two replicas on
# gpu:0 and a family's rows of several members sharing runs, 8 the stateful LSTM tick on gpu:0 beside the CPU (per-tick answers over 100 ticks,
# latency, device memory with 10,000 sequences), 9 an LSTM step in a CUDA graph (PyTorch)
# beside ONNX Runtime on the CPU, 10 the per-tick harness (tickserve-bench) on the 2x128
# LSTM tick at 1 and 64 instances and its 100-tick window over shared memory, the server on
# gpu:0 and then on the CPU (cores 0-7, the harness on 8-15). GPU_STEPS picks steps 2-10
# (all by default; step 1 always runs; 5 is the server's correctness and
# perf_analyzer), e.g. GPU_STEPS="7 10".
# Needs Python 3 with numpy and onnx (torch and onnxruntime for step 9): TICKSERVE_PYTHON,
# else /opt/torch/.venv/bin/python, else .venv/bin/python, else python3.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# begin, and step NAME SECONDS LOG COMMAND...: scripts/device/check_steps.sh.
. scripts/device/check_steps.sh
# The bundle travels packed (scripts/gpu_bundle.sh).
begin gpu "${GPU_CHECK_SECONDS:-540}"
smi_pid=
cleanup() {
  [ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

bin=.gpu
[ -x "$bin/tickserve" ] || chmod +x "$bin"/* 2>/dev/null
export TICKSERVE_ROOT=$root
export TICKSERVE_ONNXRUNTIME_LIBRARY=$root/.local/lib/libonnxruntime.so.1.31.1
export TICKSERVE_BIN=$root/$bin/tickserve
export RUST_LOG=${RUST_LOG:-info}

write_summary() {
  {
    echo "# GPU check"
    echo
    echo "Device: ${device_name:-none}; driver ${driver:-none}; build: $(head -1 $bin/BUILD 2>/dev/null || echo 'no .gpu/BUILD')"
    echo "Run $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - start)) s of $cap s; mode: $mode"
    echo
    cat "$work/env.txt" 2>/dev/null
    echo
    echo "| step | status | time | log |"
    echo "| --- | --- | --- | --- |"
    cat "$steps"
    echo
    echo "| figure | value | against | result |"
    echo "| --- | --- | --- | --- |"
    cat "$figures"
    if [ -s "$OUT/replay.log" ]; then
      echo
      echo '```'
      grep -E '^(device|  |[a-z_0-9]+ \()' "$OUT/replay.log"
      echo '```'
    fi
  } >"$OUT/summary.md"
}


# 1. The machine and its libraries, in the main shell (the loader path it sets is used
#    by every later step).
mode="GPU"
{
  echo "=== 1. machine and libraries ($(date -u +%T))"
  cat $bin/BUILD 2>/dev/null || echo "no $bin/BUILD: run scripts/gpu_bundle.sh first"
  ldd --version 2>&1 | head -1
  if command -v nvidia-smi >/dev/null && timeout 15 nvidia-smi -L; then
    IFS=, read -r device_name driver <<<"$(timeout 10 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    driver=${driver# }
  else
    echo "no GPU (nvidia-smi missing or failing): a dry run, the server phases on the CPU"
    mode="dry run (no GPU): server phases on the CPU"
  fi
  # cuBLAS and NVRTC 13: the toolkit's folders, then any Python's nvidia wheels.
  libdirs=$(timeout 20 find /usr/local /usr/lib /opt /root/.local /usr/lib64 -xdev \
    \( -name 'libcublas.so.13' -o -name 'libnvrtc.so.13' -o -name 'libcublasLt.so.13' \) \
    -not -path '*/stubs/*' -printf '%h\n' 2>/dev/null | sort -u)
  echo "found cuBLAS/NVRTC 13 in: ${libdirs:-nowhere}"
  clean=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v -e stubs -e '^$' | paste -sd:)
  export LD_LIBRARY_PATH=$(printf '%s\n' $libdirs | paste -sd:)${clean:+:$clean}:$root/.local/lib
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for lib in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13; do
    python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$lib" 2>/dev/null &&
      echo "loads: $lib" || echo "MISSING: $lib"
  done
  python3 - <<'EOF'
import ctypes
try:
    major, minor = ctypes.c_int(), ctypes.c_int()
    ctypes.CDLL("libnvrtc.so.13").nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    nvrtc = major.value * 1000 + minor.value * 10
    print(f"NVRTC {major.value}.{minor.value}")
    version = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    print(f"driver CUDA {version.value // 1000}.{version.value % 1000 // 10}: NVRTC "
          + ("is not newer, PTX loads" if nvrtc <= version.value else "is NEWER (the engine loads CUBIN, not PTX)"))
except OSError as e:
    print(f"version check: {e}")
EOF
  for f in $bin/tickserve $bin/gpu-engine $bin/gpu-runtime $bin/graph_replay; do
    missing=$(ldd "$f" 2>&1 | grep 'not found')
    echo "$f: ${missing:-every library found}"
  done
  py=${TICKSERVE_PYTHON:-}
  for candidate in /opt/torch/.venv/bin/python "$root/.venv/bin/python" python3; do
    [ -z "$py" ] && "$candidate" -c 'import numpy, onnx' 2>/dev/null && py=$candidate
  done
  echo "python: ${py:-none with numpy and onnx} ($("${py:-python3}" --version 2>&1))"
  "${py:-python3}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1
  # perf_analyzer: the carried wheel's binary where it runs, else this machine's wrapper.
  pa=
  wheel=$(ls $bin/perf_analyzer-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("perf_analyzer/bin/perf_analyzer", sys.argv[2])' "$wheel" "$work/pa"
    chmod +x "$work/pa/perf_analyzer/bin/perf_analyzer"
    # `--help` exits non-zero: what it prints tells whether the binary runs here.
    help=$("$work/pa/perf_analyzer/bin/perf_analyzer" --help 2>&1 | head -c 4000)
    if grep -qi 'usage\|concurrency-range\|invalid long option' <<<"$help"; then
      pa="$work/pa/perf_analyzer/bin/perf_analyzer"
    else
      echo "the wheel's perf_analyzer does not run here:"
      head -5 <<<"$help"
      ldd "$work/pa/perf_analyzer/bin/perf_analyzer" 2>&1 | grep -i 'not found'
    fi
  fi
  [ -z "$pa" ] && [ -x "$root/../shared/tools/perf_analyzer" ] && pa="$root/../shared/tools/perf_analyzer"
  echo "perf_analyzer: ${pa:-none runs here}"
} >"$OUT/env.log" 2>&1
echo "| 1. machine and libraries | ok | $((SECONDS - start)) s | env.log |" >>"$steps"
grep -E '^(MISSING|.*not found|NVRTC|driver CUDA|found|python|perf_analyzer)' "$OUT/env.log" | sed 's/^/    /' >"$work/env.txt"
write_summary

if [ "$mode" = GPU ]; then
  timeout $((cap + 30)) nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -lms 500 >"$OUT/mem.csv" 2>&1 &
  smi_pid=$!
  gpu_devices=gpu:0
else
  echo "no GPU: no samples" >"$OUT/mem.csv"
  gpu_devices=cpu
fi

# GPU_STEPS: which of steps 2-10 run (all by default).
wanted() { [[ " ${GPU_STEPS:-2 3 4 5 6 7 8 9 10} " == *" $1 "* ]]; }
wanted 2 && step "2. tickserve check (auto)" 60 engine.log $bin/tickserve check --config config/tickserve.toml
wanted 3 && step "3. engine vs ONNX Runtime (alpha_mlp, seq_lstm, every op, tick members, 100 LSTM ticks; graphs and eager)" 90 engine.log \
  env TICKSERVE_PYTHON="$py" $bin/gpu-engine --ignored --test-threads 1 gpu:: --skip the_resident_kernel \
  --skip a_family_compiled_resident --skip a_resident_family --skip sequences_keep_their_slots \
  --skip a_member_the_resident_table --skip a_slot_split --skip a_bucket_larger \
  --skip a_graphs_family_unloads
# 3b. The resident kernel (kernels::resident, started once, ticked through mapped memory):
# 10,000 ticks of seq_lstm_step and of bench_lstm against ONNX Runtime, a member added,
# bench_lstm's round trip over 20,000 ticks and 64 slots at once; then bench_lstm compiled
# resident through the engine's trait against its graphs (bucket 1 and 64 members in
# bucket 64), its bucket-1 run timed on the kernel and on the graphs: SUMMARY lines; and a
# resident family whose kernel stops answering failing over to its graphs; 64 sequences
# ticked in another order each round keeping their slots (no state over the bus); a
# member past a 2-row weight table running on the graphs; a slot on a cluster of 2, 4
# and 8 blocks against ONNX Runtime, and its round trip (SUMMARY); a family on clusters
# of 8 with fewer slots than its largest bucket (that bucket on the graphs); a family on
# graphs unloaded while a resident kernel runs (does freeing wait for an idle device?);
# PyTorch's stateful LSTM step (slices, joins) and every dense op resident against
# their graphs (a_family_compiled_resident_from_layout_...).
wanted 3 && step "3b. resident kernel vs ONNX Runtime, its tick's round trip, a family run resident (bench_lstm)" 120 resident.log \
  env TICKSERVE_PYTHON="$py" $bin/gpu-engine --ignored --nocapture --test-threads 1 gpu::the_resident_kernel \
  gpu::a_family_compiled_resident gpu::a_resident_family gpu::sequences_keep_their_slots \
  gpu::a_member_the_resident_table gpu::a_slot_split gpu::a_bucket_larger \
  gpu::a_graphs_family_unloads
wanted 4 && step "4. graph replay per bucket" 60 replay.log $bin/graph_replay
wanted 5 && step "3+5. server correctness and perf_analyzer ($gpu_devices vs cpu)" 150 e2e.log \
  "$py" scripts/device/gpu_check.py e2e --work "$work/e2e" --pa "$pa" --device "$gpu_devices"
tail -n 30 "$work"/e2e/server-*.log >>"$OUT/e2e.log" 2>/dev/null
wanted 6 && step "6. family of 128 members under 16 clients" 120 families.log \
  "$py" scripts/device/gpu_check.py families --work "$work/families" --pa "$pa" --device "$gpu_devices"
tail -n 30 "$work"/families/family-*.log >>"$OUT/families.log" 2>/dev/null
wanted 7 && step "7. two replicas on gpu:0; rows of 8 members sharing runs" 60 engine.log \
  $bin/gpu-runtime --ignored --test-threads 1 gpu
if wanted 7 && [ "$mode" = GPU ] && command -v gdb >/dev/null; then
  # Where the process crashes, if it does (the binaries are stripped: library frames).
  step "7b. two replicas under gdb (backtrace)" 60 engine.log timeout -k 5 55 gdb -q -batch -ex run -ex bt \
    -ex 'info threads' --args $bin/gpu-runtime --ignored two_executors_on_one_gpu
fi
wanted 8 && step "8. stateful LSTM ticks (seq_lstm_step): 64 sequences x 100 ticks, latency, 10,000 sequences" 90 \
  sequences.log "$py" scripts/device/gpu_check.py sequences --work "$work/sequences" --device "$gpu_devices"
tail -n 30 "$work"/sequences/server-*.log >>"$OUT/sequences.log" 2>/dev/null
# 8b. The same with gpu_mode = "auto": seq_lstm_step's ticks on its resident kernel.
wanted 8 && [ "$mode" = GPU ] && step "8b. stateful LSTM ticks, gpu_mode auto (seq_lstm_step resident)" 90 sequences.log \
  "$py" scripts/device/gpu_check.py sequences --work "$work/sequences-auto" --device "$gpu_devices" --gpu-mode auto
tail -n 30 "$work"/sequences-auto/server-gpu-*.log >>"$OUT/sequences.log" 2>/dev/null
wanted 9 && step "9. LSTM step: PyTorch CUDA graph vs ONNX Runtime CPU" 45 sequences.log "$py" scripts/device/gpu_check.py lstm

# 10. The per-tick harness (scripts/device/harness_case.sh) over shared memory, the server
# pinned to half the cores and the harness to the other half, first with every model on
# the GPU, then on the CPU: one tick per request, N instances each its own sequence.
if [ "$(nproc)" -ge 16 ]; then server_cpus=0-7 client_cpus=8-15; else server_cpus=0 client_cpus=1; fi
export BIN=$root/$bin MODELS=$work/bench-models CLIENT_CPUS=$client_cpus
"${py:-python3}" scripts/dev/make_models.py --bench "$MODELS" >"$work/bench-models.log" 2>&1
harness() { # DEVICE [GPU_MODE [RESIDENT_BLOCKS]]: RESIDENT_BLOCKS with the weights on chip
  local service=tickserve-gpu-check-${1/:/}${2:+-$2}${3:+-$3}
  local shape=${3:+"resident_blocks = $3\nresident_weights_on_chip = true\n"}
  printf '[repository]\npath = "%s"\n[runtime]\nonnxruntime_library = "%s"\ngpu_mode = "%s"\n'"$shape"'[shm]\nenabled = true\nservice = "%s"\n[model_defaults]\ndevices = ["%s"]\n' \
    "$MODELS" "$TICKSERVE_ONNXRUNTIME_LIBRARY" "${2:-graphs}" "$service" "$1" >"$work/harness-$service.toml"
  python3 scripts/bench/server.py --config "$work/harness-$service.toml" --binary "$bin/tickserve" \
    --taskset "$server_cpus" --log "$work/harness-$service.log" -- bash -c '
      h=scripts/device/harness_case.sh
      "$h" "$0" "bench_lstm, shm, 1 instance, $1" --model bench_lstm --ticks 3000 --warmup 200
      "$h" "$0" "bench_lstm, shm, 64 instances, $1" --model bench_lstm --instances 64 --ticks 200 --warmup 20
      "$h" "$0" "bench_lstm_window, shm, 1 instance, $1" --model bench_lstm_window --ticks 500 --warmup 50' \
    "$service" "$1${2:+ $2}${3:+, $3 blocks a slot, weights on chip}"
  local rc=$?
  tail -n 20 "$work/harness-$service.log"
  return $rc
}
export -f harness
export bin server_cpus work HARNESS_COLUMNS=4
wanted 10 && step "10a. per-tick harness, models on $gpu_devices" 75 sequences.log bash -c 'harness "$1"' _ "$gpu_devices"
wanted 10 && step "10b. per-tick harness, models on the CPU" 75 sequences.log bash -c 'harness cpu'
# 10c. The same on the GPU with gpu_mode = "auto": bench_lstm runs resident (its ticks
# through the kernel's mailboxes), bench_lstm_window on its graphs.
wanted 10 && [ "$mode" = GPU ] && step "10c. per-tick harness, models on $gpu_devices, gpu_mode auto" 75 \
  sequences.log bash -c 'harness "$1" auto' _ "$gpu_devices"
# 10d. The same with each slot on a cluster of 8 blocks holding their share of the weights
# on chip (runtime.resident_blocks, runtime.resident_weights_on_chip).
wanted 10 && [ "$mode" = GPU ] && step "10d. per-tick harness, gpu_mode auto, 8 blocks a slot, weights on chip" 75 \
  sequences.log bash -c 'harness "$1" auto 8' _ "$gpu_devices"
write_summary
cat "$OUT/summary.md"

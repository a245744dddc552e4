#!/usr/bin/env bash
# scripts/device/harness_case.sh SERVICE CASE ARGS...: one tickserve-bench run (ARGS are
# its arguments after --repository, --service and --grpc), its table, and a SUMMARY row of
# the device checks' figures table labelled CASE. Run under scripts/bench/server.py (which
# sets $TICKSERVE_GRPC_PORT), with $BIN (the folder holding tickserve-bench), $MODELS (the
# repository made by `scripts/dev/make_models.py --bench`) and $CLIENT_CPUS (taskset's
# list).
# HARNESS_COLUMNS=4 writes the row in four columns (the GPU check's figures table).
set -uo pipefail
service=$1 label=$2
shift 2
out=$(mktemp)
taskset -c "$CLIENT_CPUS" "$BIN/tickserve-bench" --repository "$MODELS" --service "$service" \
  --grpc "http://127.0.0.1:$TICKSERVE_GRPC_PORT" "$@" >"$out" 2>&1
cat "$out"
line=$(tail -1 "$out")
rm -f "$out"
python3 - "$label" "$line" <<'ROW'
import json, os, sys
label, raw = sys.argv[1], sys.argv[2]
try:
    r = json.loads(raw)
except ValueError:
    print(f"SUMMARY | {label} | failed | | | | | | |")
    sys.exit(1)
compute = ("-" if r["compute_p50_us"] is None
           else f'{r["compute_p50_us"]:.0f} / {r["compute_p99_us"]:.0f}')
if os.environ.get("HARNESS_COLUMNS") == "4":
    print(f'SUMMARY | {label} | p50 {r["p50_us"]:.1f} µs, p99 {r["p99_us"]:.1f} µs, '
          f'p99.9 {r["p999_us"]:.1f} µs, {r["throughput_per_s"]:.0f} ticks/s | '
          f'compute p50 / p99 {compute} µs | max rel. error {r["max_relative_error"]:.1e} |')
    sys.exit(0)
print(f'SUMMARY | {label} | {r["p50_us"]:.1f} | {r["p99_us"]:.1f} | {r["p999_us"]:.1f} | '
      f'{r["max_over_median"]:.1f} | {r["throughput_per_s"]:.0f} | {compute} | {r["max_relative_error"]:.1e} |')
ROW

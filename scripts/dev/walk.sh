#!/usr/bin/env bash
# One v2 HTTP JSON request's walk through the workspace's files, as the program
# runs it: files entered, moves between files, returns to a file already left,
# and the distinct calls from one file's function into another file's (a loop
# over the request's numbers counts each of its moves; a distinct call counts
# once). It traces a debug build whose functions call mcount (a nightly flag)
# with uftrace (apt-get install uftrace), serves the sample repository, sends
# three warm-up requests, waits 2 s, sends the traced one, and counts it.
#
#   RUSTFLAGS="-Z instrument-mcount -C force-frame-pointers=yes" \
#     cargo +nightly build -p tickserve-server --bin tickserve --target-dir target/mcount
#   scripts/dev/walk.sh target/mcount/debug/tickserve target/walk
#
# A release build (the same with --release) walks the program as it ships: an
# inlined function counts in the file of the function it was inlined into.
#
# REPO=DIR serves another model repository (one where alpha_mlp's model.toml
# says engine = "onnxruntime", say, to walk two builds through the same engine).
# The counter is scripts/dev/walk_count.py.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "${1:?binary built with mcount calls}")
out=${2:?output folder}
repo=${REPO:-$root/config/models}
export TICKSERVE_ONNXRUNTIME_LIBRARY=${TICKSERVE_ONNXRUNTIME_LIBRARY:-$root/.local/lib/libonnxruntime.so.1.31.1}
export LD_LIBRARY_PATH=$root/.local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rm -rf "$out"
mkdir -p "$out"
out=$(realpath "$out")
body=$(python3 -c 'import json; print(json.dumps({"inputs": [{"name": "features", "shape": [1, 50], "datatype": "FP32", "data": [0.1] * 50}]}))')
url=http://127.0.0.1:18123/v2/models/alpha_mlp/infer
cd "$root"
# --no-libcall: hooking the library calls of a Rust binary ends it with SIGILL
# (uftrace 0.13).
uftrace record --no-libcall -d "$out/uftrace.data" "$bin" serve \
  --model-repository "$repo" --model-name alpha_mlp \
  --http-port 18123 --grpc-port 18124 > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  curl -sf -o /dev/null http://127.0.0.1:18123/v2/health/ready && break
  sleep 0.5
done
for _ in 1 2 3; do curl -sf -o /dev/null -X POST -d "$body" "$url"; done
sleep 2
curl -sf -X POST -d "$body" "$url" > "$out/answer.json"
sleep 1
kill -INT "$server"
wait "$server" || true
uftrace replay -d "$out/uftrace.data" -f time,tid > "$out/replay.txt" 2>/dev/null
python3 "$root/scripts/dev/walk_count.py" "$out/replay.txt" "$bin" "$root" | tee "$out/walk.txt"

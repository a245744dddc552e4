#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (scripts/setup.sh),
# checks formatting and lints, regenerates the sample models to prove the script is
# deterministic, and runs every test (unit and integration, real servers on loopback
# driven by Triton's Python clients). CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
clippy=
trap '[ -z "$clippy" ] || kill "$clippy" 2>/dev/null; rm -rf "$tmp"' EXIT

# The build needs protoc and its well-known types (the etcd client's protos); the
# tests need etcd (the fleet's store) and its etcdctl.
scripts/apt_install.sh protoc protobuf-compiler
scripts/apt_install.sh /usr/include/google/protobuf/descriptor.proto libprotobuf-dev
scripts/apt_install.sh etcd etcd-server
scripts/apt_install.sh etcdctl etcd-client

# Clippy needs nothing the setup installs: it runs beside it (on a fresh clone
# the setup is mostly one core unpacking wheels), and its output is shown after.
cargo clippy --workspace --all-targets --locked -- -D warnings >"$tmp/clippy.log" 2>&1 &
clippy=$!
scripts/setup.sh
export TICKSERVE_ONNXRUNTIME_LIBRARY="$PWD/.local/lib/libonnxruntime.so.1.31.1"
# NVRTC for the CUDA engine's kernel tests (no GPU needed to compile kernels).
export LD_LIBRARY_PATH="$PWD/.local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== sample models are what scripts/dev/make_models.py writes"
.venv/bin/python scripts/dev/make_models.py "$tmp/models"
diff -r "$tmp/models" config/models --exclude=model.toml
echo "== the per-tick benchmark's models are deterministic"
.venv/bin/python scripts/dev/make_models.py --bench "$tmp/bench"
.venv/bin/python scripts/dev/make_models.py --bench "$tmp/bench-again"
diff -r "$tmp/bench" "$tmp/bench-again"

echo "== structure: no import circle, no front end importing another, the edge importing no front end"
.venv/bin/python scripts/dev/check_layers.py

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
clippy_status=0
wait "$clippy" || clippy_status=$?
clippy=
cat "$tmp/clippy.log"
[ "$clippy_status" -eq 0 ]

echo "== cargo test"
# The CUDA engine's emulated kernels are compiled by the host's C++ compiler.
scripts/apt_install.sh c++ g++
cargo test --workspace --locked

echo "== deploy/ manifests against the Kubernetes and KServe schemas"
.venv/bin/python deploy/validate.py

echo "== the per-tick benchmark's models load"
target/debug/tickserve check --model-repository "$tmp/bench"

echo "== three replicas behind HAProxy: each sequence on one replica"
deploy/haproxy/check.sh target/debug/tickserve

echo "== scale-out: hand-over on drain, a killed replica's sequences lost, behind HAProxy"
scripts/scaleout/scaleout_check.sh target/debug/tickserve --sequences 100 --ticks 100

echo "== the Grafana dashboard's queries against a real Prometheus"
deploy/prometheus/check.sh target/debug/tickserve

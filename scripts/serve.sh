#!/usr/bin/env bash
# Starts tickserve on the sample repository (config/models), installing what it needs
# first (scripts/setup.sh: the ONNX Runtime library, into .local/). Extra arguments go to
# `tickserve serve` (e.g. --http-port 9000). Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --locked -p tickserve-server
exec target/release/tickserve serve --config config/tickserve.toml "$@"

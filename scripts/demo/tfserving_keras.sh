#!/usr/bin/env bash
# A TF Serving user's day one: a Keras model exported with tf2onnx, served by tickserve,
# called with the client code a TF Serving user already has (requests.post with
# "instances", and tensorflow-serving-api's PredictionServiceStub with
# tf.make_tensor_proto). Answers are compared with Keras itself and with onnxruntime
# (1e-5). Not part of CI: TensorFlow is a 600 MB install.
#
#     cargo build --release -p tickserve-server && scripts/demo/tfserving_keras.sh
#
# Installs TensorFlow 2.15.1, tf2onnx 1.16.1 and tensorflow-serving-api 2.15.1 into
# .local/tfs-venv (once), writes the model to a temporary repository, and starts
# target/release/tickserve on it (scripts/bench/server.py).
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=2
cd "$(dirname "$0")/../.."
scripts/setup.sh
venv=.local/tfs-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import tf2onnx, tensorflow_serving" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
        "tensorflow==2.15.1" "tf2onnx==1.16.1" "tensorflow-serving-api==2.15.1" requests
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" scripts/demo/tfserving_keras.py export --repository "$work/models" --data "$work/data.npz"
sed "s|^path = \"config/models\".*|path = \"$work/models\"|" config/tickserve.toml > "$work/tickserve.toml"
python3 scripts/bench/server.py --config "$work/tickserve.toml" -- \
    "$venv/bin/python" scripts/demo/tfserving_keras.py call --data "$work/data.npz"
.venv/bin/python scripts/demo/tfserving_keras.py reference --repository "$work/models" --data "$work/data.npz"

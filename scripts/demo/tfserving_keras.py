#!/usr/bin/env python3
"""The three steps of scripts/demo/tfserving_keras.sh, each in the Python that has its
packages:

    export     (TensorFlow venv) build the Keras model, export it with tf2onnx into
               REPOSITORY/keras_alpha/1/model.onnx, save inputs and Keras's answers
    call       (TensorFlow venv) call the running server as a TF Serving client does,
               over REST and gRPC, compare with Keras, save the answers
    reference  (the project's venv) run the ONNX file in onnxruntime and compare
"""
import argparse
import os
import pathlib
import sys

import numpy as np

MODEL = "keras_alpha"
FEATURES = 50
ROWS = [1, 3, 64, 65, 200]
RTOL, ATOL = 1e-5, 1e-7


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def close(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}")
    worst = float(np.max(np.abs(got - want) / (RTOL * np.abs(want) + ATOL)))
    check(worst <= 1.0, f"{what}: off by {worst:.2f}x the tolerance")
    return worst


def export(args):
    import tensorflow as tf
    import tf2onnx
    tf.keras.utils.set_random_seed(0)
    # The seed's kind of model: features in, class probabilities out.
    inputs = tf.keras.Input(shape=(FEATURES,), name="features")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inputs)
    outputs = tf.keras.layers.Dense(3, activation="softmax", name="probabilities")(hidden)
    model = tf.keras.Model(inputs, outputs)
    path = pathlib.Path(args.repository) / MODEL / "1"
    path.mkdir(parents=True)
    spec = [tf.TensorSpec((None, FEATURES), tf.float32, name="features")]
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=17,
                               output_path=str(path / "model.onnx"))
    rng = np.random.default_rng(1)
    data = {f"x{n}": rng.standard_normal((n, FEATURES)).astype(np.float32) for n in ROWS}
    data.update({f"keras{n}": model.predict(data[f"x{n}"], verbose=0) for n in ROWS})
    np.savez(args.data, **data)
    print(f"exported {path / 'model.onnx'} with tf2onnx {tf2onnx.__version__}, "
          f"TensorFlow {tf.__version__}")


def call(args):
    import grpc
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import (get_model_metadata_pb2, predict_pb2,
                                         prediction_service_pb2_grpc)
    http = f"http://127.0.0.1:{os.environ['TICKSERVE_HTTP_PORT']}"
    channel = grpc.insecure_channel(f"127.0.0.1:{os.environ['TICKSERVE_GRPC_PORT']}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    data = dict(np.load(args.data))
    # What the TF Serving user's code looks like, unchanged.
    status = requests.get(f"{http}/v1/models/{MODEL}").json()
    print("status:", status)
    check(status["model_version_status"][0]["state"] == "AVAILABLE", "not AVAILABLE")
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = MODEL
    request.metadata_field.append("signature_def")
    metadata = stub.GetModelMetadata(request, 10.0)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    metadata.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    print("signature inputs:", list(signature.inputs), "outputs:", list(signature.outputs))
    out = {}
    worst = 0.0
    for n in ROWS:
        x, keras = data[f"x{n}"], data[f"keras{n}"]
        response = requests.post(f"{http}/v1/models/{MODEL}:predict",
                                 json={"instances": x.tolist()})
        check(response.status_code == 200, f"REST {n} rows: {response.status_code} {response.text}")
        rest = np.array(response.json()["predictions"], np.float32)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL
        request.model_spec.signature_name = "serving_default"
        request.inputs["features"].CopyFrom(tf.make_tensor_proto(x))
        answer = stub.Predict(request, 10.0)
        output = list(answer.outputs)[0]
        grpc_answer = tf.make_ndarray(answer.outputs[output])
        worst = max(worst, close(rest, keras, f"REST {n} rows vs Keras"),
                    close(grpc_answer, keras, f"gRPC {n} rows vs Keras"))
        out[f"rest{n}"], out[f"grpc{n}"] = rest, grpc_answer
    np.savez(args.data, **data, **out)
    print(f"REST (requests.post, instances) and gRPC (PredictionServiceStub) at {ROWS} rows "
          f"equal Keras within {RTOL} (worst {worst:.3f} of the tolerance)")


def reference(args):
    import onnxruntime as ort
    data = dict(np.load(args.data))
    session = ort.InferenceSession(str(pathlib.Path(args.repository) / MODEL / "1/model.onnx"))
    name = session.get_inputs()[0].name
    worst = 0.0
    for n in ROWS:
        want = session.run(None, {name: data[f"x{n}"]})[0]
        worst = max(worst, close(data[f"rest{n}"], want, f"REST {n} rows vs onnxruntime"),
                    close(data[f"grpc{n}"], want, f"gRPC {n} rows vs onnxruntime"))
    print(f"the same answers equal onnxruntime {ort.__version__} within {RTOL} "
          f"(worst {worst:.3f} of the tolerance)")
    print("done")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["export", "call", "reference"])
    p.add_argument("--repository")
    p.add_argument("--data", required=True)
    args = p.parse_args()
    {"export": export, "call": call, "reference": reference}[args.step](args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Drives a running tickserve through TF Serving's API, as a TF Serving client does.

    python crates/tickserve-server/tests/python/tfserving_check.py --http 127.0.0.1:8000 \
        --grpc 127.0.0.1:8001 --repository DIR

gRPC: stubs generated here (grpcio-tools) from the project's wire-compatible protos in
proto/ (the package, service, message and field names of tensorflow-serving-api), so the
calls below are what a `tensorflow_serving.apis.prediction_service_pb2_grpc` user writes:
`PredictionServiceStub.Predict` with `float_val` and with `tensor_content` (what
`tf.make_tensor_proto` sends), `GetModelMetadata`, and `ModelServiceStub.GetModelStatus`.
REST: `POST /v1/models/NAME:predict` in the row and column formats. Every model of
the repository that has only numeric inputs is run at 1, 3, 64, 65 and 200 rows and
compared with onnxruntime (Python) on the same inputs: equal within 1e-5 relative.
Started by the Rust test crates/tickserve-server/tests/server/front_ends/tfserving.rs; prints `done`.
"""
import argparse
import json
import pathlib
import sys
import tempfile
import urllib.request

import grpc
import numpy as np
import onnxruntime as ort
from grpc_tools import protoc
from reference import RTOL, check  # noqa: E402 (beside this script)
from reference import compare as compare_typed

ROOT = pathlib.Path(__file__).resolve().parents[4]
ROWS = [1, 3, 64, 65, 200]

# TensorFlow's DataType numbers and the typed field each travels in.
DTYPES = {
    np.dtype(np.float32): (1, "float_val"), np.dtype(np.float64): (2, "double_val"),
    np.dtype(np.int32): (3, "int_val"), np.dtype(np.int64): (9, "int64_val"),
    np.dtype(np.bool_): (10, "bool_val"),
}
NUMPY = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 10: np.bool_}
ONNX_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
              "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


def compare(got, want, what):
    """REST answers come back as JSON numbers: values only, not dtypes."""
    compare_typed(got, want, what, same_dtype=False)


def stubs(out):
    """Generates the Python modules from proto/ into `out` and imports them."""
    files = [str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto")
             if p.parts[len((ROOT / "proto").parts)].startswith("tensorflow")]
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={out}",
                        f"--grpc_python_out={out}", *files])
    check(code == 0, "protoc failed")
    sys.path.insert(0, str(out))
    from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2,  # noqa
                                         model_service_pb2_grpc, predict_pb2,
                                         prediction_service_pb2_grpc)
    return predict_pb2, get_model_metadata_pb2, get_model_status_pb2, \
        prediction_service_pb2_grpc, model_service_pb2_grpc


def make_inputs(session, rows, rng):
    inputs = {}
    for i in session.get_inputs():
        dtype = ONNX_TYPES[i.type]
        shape = [rows] + list(i.shape[1:])
        if dtype == np.bool_:
            inputs[i.name] = rng.random(shape) > 0.5
        elif np.issubdtype(dtype, np.integer):
            inputs[i.name] = rng.integers(-50, 50, shape).astype(dtype)
        else:
            inputs[i.name] = rng.standard_normal(shape).astype(dtype)
    return inputs


def alias(name):
    return name[:-2] if name.endswith(":0") else name


def tensor_proto(module, array, raw):
    """A TensorProto as tf.make_tensor_proto builds it (tensor_content) or typed."""
    dtype, field = DTYPES[array.dtype]
    t = module.TensorProto(dtype=dtype)
    for d in array.shape:
        t.tensor_shape.dim.add(size=d)
    if raw:
        t.tensor_content = array.tobytes()
    else:
        getattr(t, field).extend(array.ravel().tolist())
    return t


def from_proto(t):
    dtype = NUMPY[t.dtype]
    shape = [d.size for d in t.tensor_shape.dim]
    if t.tensor_content:
        return np.frombuffer(t.tensor_content, dtype=dtype).reshape(shape)
    field = DTYPES[np.dtype(dtype)][1]
    return np.array(getattr(t, field), dtype=dtype).reshape(shape)


def rest(http, model, body):
    request = urllib.request.Request(f"http://{http}/v1/models/{model}:predict",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--repository", required=True)
    p.add_argument("--models", default="alpha_mlp,half_plus_two,tf_two_inputs,typed_io",
                   help="the models to run, comma-separated; * for every model but those "
                        "--skip names")
    p.add_argument("--skip", default="")
    args = p.parse_args()
    chosen, skipped = set(args.models.split(",")), set(args.skip.split(","))
    with tempfile.TemporaryDirectory() as out:
        predict_pb2, metadata_pb2, status_pb2, prediction_grpc, model_grpc = stubs(pathlib.Path(out))
        from tensorflow.core.framework import tensor_pb2
        from tensorflow_serving.apis import get_model_metadata_pb2
        channel = grpc.insecure_channel(args.grpc)
        predictions = prediction_grpc.PredictionServiceStub(channel)
        models = model_grpc.ModelServiceStub(channel)
        rng = np.random.default_rng(7)
        checked = 0
        for path in sorted(pathlib.Path(args.repository).glob("*/*/model.onnx")):
            name = path.parts[-3]
            if (name in chosen or "*" in chosen) and name not in skipped:
                session = ort.InferenceSession(str(path))
            else:
                continue
            status = models.GetModelStatus(status_pb2.GetModelStatusRequest(
                model_spec={"name": name}))
            check(status.model_version_status[0].state == 30, f"{name}: not AVAILABLE")
            metadata = predictions.GetModelMetadata(metadata_pb2.GetModelMetadataRequest(
                model_spec={"name": name}, metadata_field=["signature_def"]))
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            metadata.metadata["signature_def"].Unpack(signature_map)
            signature = signature_map.signature_def["serving_default"]
            check(sorted(signature.inputs) == sorted(alias(i.name) for i in session.get_inputs()),
                  f"{name}: signature inputs {sorted(signature.inputs)}")
            outputs = [o.name for o in session.get_outputs()]
            for rows in ROWS:
                inputs = make_inputs(session, rows, rng)
                want = dict(zip(outputs, session.run(None, inputs)))
                for raw in (False, True):
                    request = predict_pb2.PredictRequest(model_spec={"name": name})
                    for key, array in inputs.items():
                        request.inputs[alias(key)].CopyFrom(tensor_proto(tensor_pb2, array, raw))
                    answer = predictions.Predict(request, timeout=30)
                    for o in outputs:
                        compare(from_proto(answer.outputs[alias(o)]), want[o],
                                f"{name} gRPC rows={rows} raw={raw} {o}")
                columns = {alias(k): v.tolist() for k, v in inputs.items()}
                answer = rest(args.http, name, {"inputs": columns})["outputs"]
                instances = [{k: v[r] for k, v in columns.items()} for r in range(rows)]
                by_row = rest(args.http, name, {"instances": instances})["predictions"]
                for o in outputs:
                    got = answer if len(outputs) == 1 else answer[alias(o)]
                    compare(np.array(got), want[o], f"{name} REST columns rows={rows} {o}")
                    got = by_row if len(outputs) == 1 else [r[alias(o)] for r in by_row]
                    compare(np.array(got), want[o], f"{name} REST rows rows={rows} {o}")
                checked += 1
        check(checked >= 3 * len(ROWS), f"only {checked} model and row combinations ran")
        print(f"{checked} model and row combinations equal onnxruntime within {RTOL}")
    print("done")


if __name__ == "__main__":
    main()

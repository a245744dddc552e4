#!/usr/bin/env python3
"""The prediction journal against what real clients received.

    # 1. send: every front end, several models, unique inputs per request
    python crates/tickserve-server/tests/python/journal_check.py --http H --grpc G \
        --service SHM send --sent sent.json --count 600
    # 2. (stop the server: the journal's files end and sync)
    # 3. read: every record by its inputs, its outputs against what the client got
    python crates/tickserve-server/tests/python/journal_check.py --http H --grpc G \
        read --sent sent.json --journal DIR

Front ends: Triton's Python clients over HTTP (JSON and binary tensors) and gRPC
(unary and a ModelStreamInfer stream), TF Serving's REST and gRPC Predict (stubs
generated from proto/ as tfserving_check.py does), and shared memory
(tickserve_client.ShmClient). Models: alpha_mlp (an MLP; also with Monte Carlo),
seq_lstm (an LSTM over a window), tick_001 (a family member), tree_gbt (a tree
ensemble) and seq_lstm_step (stateful: sequences over the front ends that carry
parameters). Each request's first element is its own number, so a record is found
by its inputs whichever front end sent it (TF Serving's API has no request id).

`read` opens every file with pyarrow and with polars, and checks the records are
exactly the requests sent (none missing, none extra, none twice) with the outputs
bit for bit as the client got them (a REST client gets JSON numbers: those must
parse to the recorded float32 exactly). Prints `journal matches`.
"""
import argparse
import json
import pathlib
import queue
import tempfile
import urllib.request

import grpc
import numpy as np
import polars as pl
import pyarrow.ipc as ipc
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from reference import check  # noqa: E402 (beside this script)
from tfserving_check import from_proto, stubs  # noqa: E402

V2 = ["http_json", "http_binary", "grpc", "grpc_stream", "shm"]
TFS = ["tfs_rest", "tfs_grpc"]
MODELS = ["alpha_mlp", "seq_lstm", "tick_001", "tree_gbt"]
SEQUENCE_MODELS = ["seq_lstm_step", "seq_lstm_window"]


def metadata(http, name):
    with urllib.request.urlopen(f"http://{http}/v2/models/{name}") as r:
        m = json.loads(r.read())
    return m["inputs"][0]["name"], [d for d in m["inputs"][0]["shape"][1:]]


def key(model, array):
    return f"{model}:{np.ascontiguousarray(array, dtype=np.float32).tobytes().hex()}"


class Senders:
    def __init__(self, args, tf_out):
        self.args = args
        self.http = thttp.InferenceServerClient(args.http)
        self.grpc = tgrpc.InferenceServerClient(args.grpc)
        self.stream_answers = queue.Queue()
        self.grpc_stream = tgrpc.InferenceServerClient(args.grpc)
        self.grpc_stream.start_stream(
            callback=lambda result, error: self.stream_answers.put((result, error)))
        self.shm = None
        if args.service:
            from tickserve_client import ShmClient
            self.shm = ShmClient(args.service)
        predict_pb2, _, _, prediction_grpc, _ = stubs(tf_out)
        self.predict_pb2 = predict_pb2
        self.tf = prediction_grpc.PredictionServiceStub(grpc.insecure_channel(args.grpc))

    def send(self, front, model, name, x, request_id, parameters):
        """Sends one request; returns {output name: float32 bytes} as the client got them."""
        # Triton's clients carry the sequence as arguments of their own (its
        # parameter names are reserved to them).
        parameters = dict(parameters or {})
        sequence = {k: parameters.pop(k) for k in ("sequence_id", "sequence_start")
                    if k in parameters}
        if front == "shm":
            parameters.update(sequence)
        if front in ("http_json", "http_binary"):
            inp = thttp.InferInput(name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=(front == "http_binary"))
            r = self.http.infer(model, [inp], request_id=request_id, parameters=parameters or None,
                                **sequence)
            return {o["name"]: r.as_numpy(o["name"]).astype(np.float32).tobytes()
                    for o in r.get_response()["outputs"]}
        if front == "grpc":
            inp = tgrpc.InferInput(name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            r = self.grpc.infer(model, [inp], request_id=request_id, parameters=parameters or None,
                                **sequence)
            return {o.name: r.as_numpy(o.name).tobytes() for o in r.get_response().outputs}
        if front == "grpc_stream":
            inp = tgrpc.InferInput(name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            self.grpc_stream.async_stream_infer(model, [inp], request_id=request_id,
                                                parameters=parameters or None, **sequence)
            result, error = self.stream_answers.get(timeout=30)
            check(error is None, f"stream: {error}")
            return {o.name: result.as_numpy(o.name).tobytes()
                    for o in result.get_response().outputs}
        if front == "shm":
            got = self.shm.infer(model, {name: x}, parameters=parameters or None)
            return {n: np.ascontiguousarray(v).tobytes() for n, v in got.items()}
        if front == "tfs_rest":
            body = json.dumps({"instances": x.tolist()}).encode()
            request = urllib.request.Request(
                f"http://{self.args.http}/v1/models/{model}:predict", data=body,
                method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request) as r:
                predictions = json.loads(r.read())["predictions"]
            # One output: a list per row; several: a dict per row.
            if predictions and isinstance(predictions[0], dict):
                names = predictions[0].keys()
                return {n: np.array([p[n] for p in predictions], dtype=np.float32).tobytes()
                        for n in names}
            return {"*": np.array(predictions, dtype=np.float32).tobytes()}
        if front == "tfs_grpc":
            request = self.predict_pb2.PredictRequest()
            request.model_spec.name = model
            request.inputs[name].CopyFrom(self._tensor(x))
            response = self.tf.Predict(request, timeout=30)
            return {n: from_proto(t).astype(np.float32).tobytes()
                    for n, t in response.outputs.items()}
        raise ValueError(front)

    def _tensor(self, x):
        from tensorflow.core.framework import tensor_pb2
        t = tensor_pb2.TensorProto(dtype=1)
        for d in x.shape:
            t.tensor_shape.dim.add(size=d)
        t.tensor_content = x.tobytes()
        return t

    def close(self):
        self.grpc_stream.stop_stream()


def send(args):
    rng = np.random.default_rng(5)
    shapes = {m: metadata(args.http, m) for m in MODELS + SEQUENCE_MODELS}
    fronts = V2 + TFS if args.service else [f for f in V2 + TFS if f != "shm"]
    sent = {}
    started_sequences = set()
    with tempfile.TemporaryDirectory() as out:
        senders = Senders(args, pathlib.Path(out))
        for n in range(args.count):
            front = fronts[n % len(fronts)]
            kind = (n // len(fronts)) % 6
            parameters = None
            if kind == 5 and front in V2:
                # A stateful tick: one sequence per model and front end; the
                # models take turns (state pairs, a window).
                which = (n // (6 * len(fronts))) % len(SEQUENCE_MODELS)
                model = SEQUENCE_MODELS[which]
                sequence = 1000 * (which + 1) + V2.index(front)
                parameters = {"sequence_id": sequence,
                              "sequence_start": sequence not in started_sequences}
                started_sequences.add(sequence)
            elif kind == 4 and front in V2 and front != "grpc_stream":
                # Monte Carlo: the server draws the seed and records it.
                model = "alpha_mlp"
                parameters = {"mc_samples": 8, "mc_noise_sigma": 0.05}
            else:
                model = MODELS[kind % len(MODELS)]
            name, dims = shapes[model]
            x = rng.standard_normal([1] + dims).astype(np.float32)
            x.flat[0] = float(n)
            request_id = f"j-{n}"
            got = senders.send(front, model, name, x, request_id, parameters)
            k = key(model, x)
            check(k not in sent, f"request {n}: inputs not unique")
            sent[k] = {"n": n, "front": front, "id": request_id,
                       "outputs": {o: b.hex() for o, b in got.items()}}
        senders.close()
    pathlib.Path(args.sent).write_text(json.dumps(sent))
    print(f"sent {len(sent)} requests over {len(fronts)} front ends")


def read(args):
    sent = json.loads(pathlib.Path(args.sent).read_text())
    files = sorted(pathlib.Path(args.journal).rglob("*.arrows"))
    check(files, f"no journal files under {args.journal}")
    seen = set()
    protocols = {"http_json": "http", "http_binary": "http", "grpc": "grpc",
                 "grpc_stream": "grpc_stream", "shm": "shm", "tfs_rest": "tfs_rest",
                 "tfs_grpc": "tfs_grpc"}
    records = 0
    for f in files:
        table = ipc.open_stream(str(f)).read_all()
        frame = pl.read_ipc_stream(str(f))
        check(frame.height == table.num_rows, f"{f}: polars and pyarrow disagree")
        model = table.schema.metadata[b"tickserve.model"].decode()
        inputs = [c for c in table.column_names if c.startswith("input.")]
        outputs = [c for c in table.column_names if c.startswith("output.")]
        # Nanosecond times become Python objects only through pandas; the
        # times are checked with polars below.
        check(frame["received"].dtype == pl.Datetime("ns", "UTC"), "received: not ns UTC")
        check((frame["answered"] >= frame["received"]).all(), f"{f}: answered before received")
        rows = table.drop_columns(["received", "answered", "queue", "compute"]).to_pylist()
        for row in rows:
            records += 1
            check(row["status"] == "ok", f"{model} record {row['record']}: {row['error']}")
            x = np.array(row[inputs[0]], dtype=np.float32)
            k = key(model, x)
            check(k in sent, f"{model} record {row['record']}: a request nobody sent")
            check(k not in seen, f"{model} record {row['record']}: recorded twice")
            seen.add(k)
            want = sent[k]
            check(row["protocol"] == protocols[want["front"]],
                  f"request {want['n']}: protocol {row['protocol']}, sent over {want['front']}")
            if want["front"] in V2 and want["front"] != "shm":  # ShmClient numbers its own
                check(row["request_id"] == want["id"], f"request {want['n']}: id {row['request_id']}")
            if row["mc_outputs"] is not None:
                got = {o["name"]: o["data"] for o in row["mc_outputs"]}
                check(row["mc_seed"] is not None, f"request {want['n']}: no seed recorded")
            else:
                got = {c[len("output."):]: np.array(row[c], dtype=np.float32).tobytes()
                       for c in outputs if row[c] is not None}
            client = {o: bytes.fromhex(h) for o, h in want["outputs"].items()}
            if "*" in client:  # TF REST's one unnamed output
                client = {next(iter(got)): client["*"]}
            check(client == got, f"request {want['n']} over {want['front']} to {model}: "
                  f"the record's outputs differ from what the client got")
    missing = set(sent) - seen
    check(not missing, f"{len(missing)} requests have no record, e.g. "
          f"{[sent[k]['n'] for k in list(missing)[:5]]}")
    print(f"journal matches: {records} records in {len(files)} files, every request "
          f"sent, bit for bit")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("mode", choices=["send", "read"])
    p.add_argument("--service")
    p.add_argument("--sent", required=True)
    p.add_argument("--count", type=int, default=600)
    p.add_argument("--journal")
    args = p.parse_args()
    send(args) if args.mode == "send" else read(args)
    print("done")


if __name__ == "__main__":
    main()

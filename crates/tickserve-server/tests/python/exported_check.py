#!/usr/bin/env python3
"""Models third-party exporters wrote, served by a running tickserve on the compiled CPU
engine, over every front end, against onnxruntime (Python).

    python crates/tickserve-server/tests/python/exported_check.py --http 127.0.0.1:8000 \
        --grpc 127.0.0.1:8001 --service tickserve --repository DIR --engine tickserve_cpu \
        [--nan] [--except NAME=ENGINE ...]

For every model of the repository: its configuration (HTTP and gRPC) names `--engine` (or
the one `--except` gives it) as its platform and backend; then 1, 3, 64 and 65 random rows
in every input (with `--nan`, one value in ten NaN: tree ensembles read NaN as a missing
value) over KServe v2 HTTP (binary tensors and JSON) and
gRPC with Triton's clients, and over shared memory with tickserve_client.ShmClient, every
output equal to onnxruntime's on the same rows within 1e-5 (labels exactly, where the top
two probabilities are apart). TF Serving's API runs the same repository in
tfserving_check.py. Prints `done`. Started by the Rust test
crates/tickserve-server/tests/server/features/exported_models.rs.
"""
import argparse
import pathlib

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from reference import check, compare  # noqa: E402 (beside this script)
from tickserve_client import ShmClient

ROWS = [1, 3, 64, 65]
# An engine's platform and backend in the model configuration (Triton's names for ONNX
# Runtime).
PLATFORMS = {"tickserve_cpu": ("tickserve_cpu", "tickserve_cpu"),
             "onnxruntime": ("onnxruntime_onnx", "onnxruntime")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--repository", required=True, type=pathlib.Path)
    p.add_argument("--engine", required=True)
    p.add_argument("--nan", action="store_true")
    p.add_argument("--except", dest="exceptions", action="append", default=[])
    args = p.parse_args()
    engines = dict(e.split("=", 1) for e in args.exceptions)
    h = httpclient.InferenceServerClient(args.http)
    g = grpcclient.InferenceServerClient(args.grpc)
    shm = ShmClient(args.service)
    rng = np.random.default_rng(20261205)
    models = sorted(d.name for d in args.repository.iterdir() if (d / "1" / "model.onnx").exists())
    check(len(models) >= 13, f"the corpus: {models}")
    for name in models:
        engine = engines.get(name, args.engine)
        named = PLATFORMS[engine]
        config = h.get_model_config(name)
        check((config["platform"], config["backend"]) == named,
              f"{name} HTTP config: {config['platform']}, {config['backend']}")
        gconfig = g.get_model_config(name).config
        check((gconfig.platform, gconfig.backend) == named,
              f"{name} gRPC config: {gconfig.platform}, {gconfig.backend}")
        if "sequence_batching" in config:
            # A stateful model: its state is hidden from clients, and its ticks carry
            # sequence parameters (tick by tick against onnxruntime: sequence_check.py).
            print(f"ok {name}: {engine}, stateful")
            continue
        session = ort.InferenceSession(str(args.repository / name / "1" / "model.onnx"))
        ins, outs = session.get_inputs(), session.get_outputs()
        for rows in ROWS:
            feed = {}
            for inp in ins:
                x = rng.standard_normal([rows] + list(inp.shape[1:])).astype(np.float32)
                if args.nan:
                    x[rng.random(x.shape) < 0.1] = np.nan
                feed[inp.name] = x
            want = session.run(None, feed)
            # JSON has no NaN: the JSON request carries the rows with 0 for NaN.
            plain = {n: np.where(np.isnan(x), np.float32(0), x) for n, x in feed.items()}
            wants = {"HTTP binary=False": session.run(None, plain)}
            answers = {}
            for binary in (True, False):
                http_inputs = []
                for n, x in (feed if binary else plain).items():
                    i = httpclient.InferInput(n, list(x.shape), "FP32")
                    i.set_data_from_numpy(x, binary_data=binary)
                    http_inputs.append(i)
                requested = [httpclient.InferRequestedOutput(o.name, binary_data=binary)
                             for o in outs]
                r = h.infer(name, http_inputs, outputs=requested)
                answers[f"HTTP binary={binary}"] = {o.name: r.as_numpy(o.name) for o in outs}
            grpc_inputs = []
            for n, x in feed.items():
                i = grpcclient.InferInput(n, list(x.shape), "FP32")
                i.set_data_from_numpy(x)
                grpc_inputs.append(i)
            r = g.infer(name, grpc_inputs)
            answers["gRPC"] = {o.name: r.as_numpy(o.name) for o in outs}
            answers["shm"] = shm.infer(name, feed)
            for front, got in answers.items():
                for o, w in zip(outs, wants.get(front, want)):
                    # ONNX Runtime's label is [rows] even where the file declares [1].
                    compare(got[o.name], w, f"{name} {front} rows={rows} {o.name}")
        print(f"ok {name}: {engine}, rows {ROWS} over HTTP (binary, JSON), gRPC and "
              f"shared memory equal onnxruntime")
    print("done")


if __name__ == "__main__":
    main()

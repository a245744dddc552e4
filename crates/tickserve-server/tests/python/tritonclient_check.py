#!/usr/bin/env python3
"""Drives a running tickserve with Triton's official Python clients (HTTP and gRPC).

    python crates/tickserve-server/tests/python/tritonclient_check.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 \
        --repository config/models

Checks server and model metadata, then runs every model of the repository with
1 to 200 rows (every bucket, and splits) over HTTP (binary tensors and JSON) and gRPC, and
compares every output with onnxruntime (Python) on the same inputs: equal within
1e-5 relative. Exits non-zero on the first mismatch. Started by the Rust test
crates/tickserve-server/tests/server/front_ends/tritonclient.rs.
"""
import argparse
import pathlib
import sys

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from reference import RTOL, check, compare  # noqa: E402 (beside this script)

# Every bucket of the default [1, 2, 4, 8, 16, 32, 64]: 3 → 4, 17 → 32, 33 → 64,
# 65 → 64 + 1, 200 → 3 × 64 + 8.
ROWS = [1, 2, 3, 8, 16, 17, 33, 64, 65, 200]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--repository", required=True, type=pathlib.Path)
    args = p.parse_args()

    h = httpclient.InferenceServerClient(args.http)
    g = grpcclient.InferenceServerClient(args.grpc)
    check(h.is_server_live() and h.is_server_ready(), "HTTP live/ready")
    check(g.is_server_live() and g.is_server_ready(), "gRPC live/ready")
    check(h.get_server_metadata()["name"] == "tickserve", "HTTP server metadata")
    check(g.get_server_metadata().name == "tickserve", "gRPC server metadata")

    rng = np.random.default_rng(1234)
    models = sorted(d.name for d in args.repository.iterdir() if d.is_dir())
    check(len(models) >= 10, f"sample repository has every model: {models}")
    for name in models:
        version = max(int(v.name) for v in (args.repository / name).iterdir() if v.name.isdigit())
        session = ort.InferenceSession(str(args.repository / name / str(version) / "model.onnx"))
        ins, outs = session.get_inputs(), session.get_outputs()

        hm = h.get_model_metadata(name)
        gm = g.get_model_metadata(name)
        check(h.is_model_ready(name) and g.is_model_ready(name), f"{name} ready")
        if "sequence_batching" in h.get_model_config(name):
            # A stateful model: clients see it without its state inputs and outputs
            # (tick by tick against onnxruntime: sequence_check.py).
            state = h.get_model_config(name)["sequence_batching"]["state"]
            hidden = {s["input_name"] for s in state} | {s["output_name"] for s in state}
            check([i["name"] for i in hm["inputs"]] == [i.name for i in ins if i.name not in hidden],
                  f"{name} HTTP input names without the state")
            check([o.name for o in gm.outputs] == [o.name for o in outs if o.name not in hidden],
                  f"{name} gRPC output names without the state")
            check(g.get_model_config(name).config.HasField("sequence_batching"),
                  f"{name} gRPC sequence_batching")
            print(f"ok {name}: stateful, its state hidden from clients")
            continue
        check([i["name"] for i in hm["inputs"]] == [i.name for i in ins], f"{name} HTTP input names")
        check([o.name for o in gm.outputs] == [o.name for o in outs], f"{name} gRPC output names")
        check(hm["inputs"][0]["datatype"] == "FP32" and gm.inputs[0].datatype == "FP32", f"{name} datatype")
        dims = [int(d) for d in hm["inputs"][0]["shape"][1:]]
        check(list(gm.inputs[0].shape) == [-1] + dims, f"{name} gRPC shape {gm.inputs[0].shape}")
        check(int(h.get_model_config(name)["max_batch_size"]) >= 200, f"{name} config")

        for rows in ROWS:
            x = rng.standard_normal([rows] + dims).astype(np.float32)
            want = session.run(None, {ins[0].name: x})
            for binary in (True, False):
                i = httpclient.InferInput(ins[0].name, list(x.shape), "FP32")
                i.set_data_from_numpy(x, binary_data=binary)
                requested = [httpclient.InferRequestedOutput(o.name, binary_data=binary) for o in outs]
                r = h.infer(name, [i], outputs=requested)
                for o, w in zip(outs, want):
                    compare(r.as_numpy(o.name), w, f"{name} HTTP binary={binary} rows={rows} {o.name}")
            i = grpcclient.InferInput(ins[0].name, list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            r = g.infer(name, [i])
            for o, w in zip(outs, want):
                compare(r.as_numpy(o.name), w, f"{name} gRPC rows={rows} {o.name}")
        stats = h.get_inference_statistics(name)["model_stats"][0]["inference_stats"]
        counts = {k: stats[k]["count"] for k in ("success", "compute_input", "compute_infer", "compute_output")}
        check(len(set(counts.values())) == 1 and counts["success"] == 3 * len(ROWS), f"{name} stats {counts}")
        gstats = g.get_inference_statistics(name).model_stats[0]
        check(gstats.inference_count == 3 * sum(ROWS), f"{name} gRPC inference_count {gstats.inference_count}")
        print(f"ok {name}: rows {ROWS} over HTTP (binary, JSON) and gRPC match onnxruntime")
    # Model families: the eight tick_* models share one family key, the others do not.
    family = {m: h.get_model_metadata(m)["parameters"]["family"] for m in models}
    check(len({family[f"tick_{i:03d}"] for i in range(8)}) == 1, f"tick_* families {family}")
    check(family["alpha_mlp"] != family["tick_000"] != family["seq_lstm"], f"families {family}")
    grpc_family = g.get_model_config("tick_003").config.parameters["family"].string_value
    check(grpc_family == family["tick_000"], f"gRPC ModelConfig family {grpc_family}")
    print("families: tick_000..tick_007 share", family["tick_000"])
    print("all models match")


if __name__ == "__main__":
    main()

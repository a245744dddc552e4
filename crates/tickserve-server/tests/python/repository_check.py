#!/usr/bin/env python3
"""Model control with Triton's official Python clients (HTTP and gRPC) against a
running tickserve whose repository is a scratch copy.

    python crates/tickserve-server/tests/python/repository_check.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 \
        --repository /tmp/scratch --source config/models

The scratch repository starts with alpha_mlp, tick_000 and tick_001. Checks:
the repository index; a new member of the loaded tick family (tick_002 over
HTTP, tick_003 over gRPC) loads with the compilations counter unchanged and
matches onnxruntime (Python) in every bucket; unloading a model while requests
for it are in flight answers every admitted request (never an internal error)
and then reports it unavailable; a failed load (a broken version 2) leaves
version 1 serving; loading a name that is not in the repository is refused.
Started by crates/tickserve-server/tests/server/operations/repository.rs.
"""
import argparse
import pathlib
import re
import shutil
import sys
import threading
import urllib.request

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROWS = [1, 2, 3, 8, 16, 17, 33, 64, 65]
RTOL, ATOL = 1e-5, 1e-6  # as reference.py: the engines add in different orders


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok {what}")


def compilations(http):
    text = urllib.request.urlopen(f"http://{http}/metrics").read().decode()
    return sum(float(m.group(1)) for m in
               re.finditer(r"^tickserve_graph_compilations_total\{[^}]*\} (\S+)$", text, re.M))


def index(h):
    return {(m["name"], m.get("version", "")): (m["state"], m.get("reason", ""))
            for m in h.get_model_repository_index()}


def matches_onnxruntime(h, name, path, rng):
    session = ort.InferenceSession(str(path))
    for rows in ROWS:
        x = rng.standard_normal([rows, 16]).astype(np.float32)
        want = session.run(None, {"features": x})[0]
        i = httpclient.InferInput("features", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        got = h.infer(name, [i]).as_numpy("signal")
        if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
            return f"{name} rows={rows}: max diff {np.abs(got - want).max()}"
    return None


def one_row(client, module, name):
    x = np.full([1, 16], 0.25, np.float32)
    i = module.InferInput("features", [1, 16], "FP32")
    i.set_data_from_numpy(x)
    return client.infer(name, [i]).as_numpy("signal")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--repository", required=True, type=pathlib.Path)
    p.add_argument("--source", required=True, type=pathlib.Path)
    args = p.parse_args()
    h = httpclient.InferenceServerClient(args.http)
    g = grpcclient.InferenceServerClient(args.grpc)
    rng = np.random.default_rng(7)

    idx = index(h)
    check(all(idx.get((m, "1"), ("",))[0] == "READY" for m in ("alpha_mlp", "tick_000", "tick_001")),
          f"HTTP index lists the loaded models: {idx}")
    gidx = {(m.name, m.version): m.state for m in g.get_model_repository_index().models}
    check(gidx.get(("tick_001", "1")) == "READY", f"gRPC index: {gidx}")
    at_start = compilations(args.http)

    # New members of the loaded family compile nothing.
    shutil.copytree(args.source / "tick_002", args.repository / "tick_002")
    check(index(h).get(("tick_002", ""), ("",))[0] == "UNAVAILABLE", "a model on disk, not loaded, is UNAVAILABLE")
    h.load_model("tick_002")
    check(h.is_model_ready("tick_002"), "tick_002 loaded over HTTP")
    shutil.copytree(args.source / "tick_003", args.repository / "tick_003")
    g.load_model("tick_003")
    check(g.is_model_ready("tick_003"), "tick_003 loaded over gRPC")
    check(compilations(args.http) == at_start, f"compilations unchanged ({at_start}) after two new members")
    for name in ("tick_002", "tick_003"):
        problem = matches_onnxruntime(h, name, args.source / name / "1" / "model.onnx", rng)
        check(problem is None, f"{name} matches onnxruntime in every bucket ({problem})")
    meta = h.get_model_metadata("tick_002")
    check(meta["parameters"]["family"] == h.get_model_metadata("tick_000")["parameters"]["family"],
          "tick_002 reports the family of tick_000")

    # Unload while requests are in flight: each admitted request is answered.
    outcomes, done = [], threading.Semaphore(0)

    def answered(result, error):
        outcomes.append("ok" if error is None else f"refused: {error}")
        done.release()
    x = np.full([1, 16], 0.25, np.float32)
    i = grpcclient.InferInput("features", [1, 16], "FP32")
    i.set_data_from_numpy(x)
    for n in range(400):
        g.async_infer("tick_002", [i], answered)
        if n == 200:
            h.unload_model("tick_002")
    for _ in range(400):
        done.acquire()
    internal = [o for o in outcomes if o != "ok" and "not found" not in o]
    check(not internal and outcomes.count("ok") > 0,
          f"unload with requests in flight: {outcomes.count('ok')} answered, "
          f"{len(outcomes) - outcomes.count('ok')} refused as not found, none failed otherwise {internal[:3]}")
    check(g.is_model_ready("tick_003"), "tick_003, same family, still ready")
    try:
        one_row(g, grpcclient, "tick_002")
        check(False, "tick_002 answered after unload")
    except InferenceServerException as e:
        check("not found" in str(e), f"tick_002 after unload: {e}")
    check(index(h).get(("tick_002", "")) == ("UNAVAILABLE", "unloaded"), "index reports tick_002 unloaded")
    want = one_row(h, httpclient, "tick_000")
    check(want.shape == (1, 1), "tick_000, same family, still serves")
    h.unload_model("tick_001")
    check(not h.is_model_ready("tick_001"), "tick_001 unloaded over HTTP")
    ready = [m["name"] for m in h.get_model_repository_index()
             if m["state"] == "READY"]
    check(sorted(ready) == ["alpha_mlp", "tick_000", "tick_003"], f"ready after unloads: {ready}")

    # A failed load leaves the serving version serving.
    broken = args.repository / "tick_000" / "2"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not an onnx file")
    try:
        h.load_model("tick_000")
        check(False, "loading a broken version succeeded")
    except InferenceServerException as e:
        check("load failed" in str(e) and "version 2" in str(e), f"broken version 2 refused: {e}")
    check(h.is_model_ready("tick_000", "1"), "tick_000 version 1 still ready")
    check(np.array_equal(one_row(g, grpcclient, "tick_000"), want), "tick_000 version 1 still answers the same")
    shutil.rmtree(broken)

    # Reloading a model and loading one that does not exist.
    h.load_model("alpha_mlp")
    check(h.is_model_ready("alpha_mlp"), "alpha_mlp reloaded")
    try:
        g.load_model("no_such_model")
        check(False, "loading a missing model succeeded")
    except InferenceServerException as e:
        check("no_such_model" in str(e), f"missing model refused: {e}")
    print("repository control ok")


if __name__ == "__main__":
    main()

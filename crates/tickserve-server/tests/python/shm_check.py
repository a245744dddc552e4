#!/usr/bin/env python3
"""The shared-memory front end through the Python client (tickserve_client.ShmClient).

    python crates/tickserve-server/tests/python/shm_check.py --http 127.0.0.1:8000 \
        --grpc 127.0.0.1:8001 --service tickserve --repository config/models

- Every stateless sample model at 1, 3, 64, 65 and 200 rows equals onnxruntime within
  1e-5 (reference.compare).
- The bad-input cases of the other front ends give the same error kinds: an unknown model
  (NOT_FOUND), an unknown input, a wrong datatype, a wrong shape, NaN (INVALID_ARGUMENT),
  too many rows (INVALID_ARGUMENT), each followed by a good request that is served.
- A client killed in the middle of a request (SIGKILL while its request is in flight)
  leaves the others served, and the server answers the next client at once.
- A client past the server's bound on clients is told the server takes no more
  clients, not that there is no server.
Prints `done`. Started by crates/tickserve-server/tests/server/front_ends/shm.rs.
"""
import argparse
import json
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import onnxruntime as ort
from reference import check, compare  # noqa: E402 (beside this script)
from tickserve_client import ServerError, ShmClient

ROWS = [1, 3, 64, 65, 200]

VICTIM = """
import sys, numpy as np
from tickserve_client import ShmClient
client = ShmClient(sys.argv[1])
x = np.random.rand(64, 30, 8).astype(np.float32)
print("ready", flush=True)
while True:
    client.infer("seq_lstm", {"window": x})
"""


def expect_error(client, code, model, inputs, what):
    try:
        client.infer(model, inputs)
    except ServerError as e:
        check(e.code == code, f"{what}: {e.code} ({e.message}), expected {code}")
        return e.message
    check(False, f"{what}: answered, expected {code}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc")
    p.add_argument("--service", required=True)
    p.add_argument("--repository", required=True, type=pathlib.Path)
    args = p.parse_args()
    client = ShmClient(args.service)
    rng = np.random.default_rng(17)
    for model_dir in sorted(d for d in args.repository.iterdir() if d.is_dir()):
        name = model_dir.name
        with urllib.request.urlopen(f"http://{args.http}/v2/models/{name}/config") as r:
            if "sequence_batching" in json.loads(r.read()):
                continue  # stateful: its ticks carry sequence parameters (sequence_check.py)
        session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
        inp, outs = session.get_inputs()[0], session.get_outputs()
        for rows in ROWS:
            x = rng.standard_normal([rows] + list(inp.shape[1:])).astype(np.float32)
            want = session.run(None, {inp.name: x})
            got = client.infer(name, {inp.name: x})
            for o, w in zip(outs, want):
                compare(got[o.name], w, f"{name} rows={rows} {o.name}")
        print(f"ok {name}: rows {ROWS} equal onnxruntime")

    good = {"features": rng.standard_normal((1, 50)).astype(np.float32)}
    cases = [
        ("NOT_FOUND", "no_such_model", good, "an unknown model"),
        ("INVALID_ARGUMENT", "alpha_mlp", {"x": good["features"]}, "an unknown input"),
        ("INVALID_ARGUMENT", "alpha_mlp", {"features": good["features"].astype(np.float64)},
         "a wrong datatype"),
        ("INVALID_ARGUMENT", "alpha_mlp", {"features": np.zeros((1, 49), np.float32)},
         "a wrong shape"),
        ("INVALID_ARGUMENT", "alpha_mlp", {"features": np.full((1, 50), np.nan, np.float32)},
         "NaN"),
        ("INVALID_ARGUMENT", "alpha_mlp", {"features": np.zeros((5000, 50), np.float32)},
         "too many rows"),
    ]
    for code, model, inputs, what in cases:
        message = expect_error(client, code, model, inputs, what)
        check(model in message, f"{what}: the message names the model: {message}")
        check("probabilities" in client.infer("alpha_mlp", good), f"a good request after {what}")
    print("ok bad input: the other front ends' error kinds, and a good request after each")

    # Parameters in the block: a sequence keeps its state between shared-memory requests
    # exactly as over HTTP, and a wrong type is refused naming the parameter.
    ticks = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(4)]
    over_shm, over_http = [], []
    for t, tick in enumerate(ticks):
        over_shm.append(client.infer("seq_lstm_step", {"tick": tick}, parameters={
            "sequence_id": "shm-check", "sequence_start": t == 0, "priority": 1})["prediction"])
        body = json.dumps({"inputs": [{"name": "tick", "datatype": "FP32", "shape": [1, 8],
                                       "data": tick.ravel().tolist()}],
                           "parameters": {"sequence_id": 777, "sequence_start": t == 0}})
        request = urllib.request.Request(f"http://{args.http}/v2/models/seq_lstm_step/infer",
                                         data=body.encode(), method="POST")
        with urllib.request.urlopen(request) as r:
            answer = json.loads(r.read())
        out = next(o for o in answer["outputs"] if o["name"] == "prediction")
        over_http.append(np.array(out["data"], np.float32).reshape(out["shape"]))
    for t, (a, b) in enumerate(zip(over_shm, over_http)):
        compare(a, b, f"seq_lstm_step tick {t} over shm and HTTP")
    try:
        client.infer("seq_lstm_step", {"tick": ticks[0]}, parameters={"sequence_id": 1.5})
        check(False, "a double sequence_id was accepted")
    except ServerError as e:
        check(e.code == "INVALID_ARGUMENT" and "parameter sequence_id" in e.message, str(e))
    print("ok parameters: a sequence over shared memory equals HTTP; a wrong type is refused")

    victim = subprocess.Popen([sys.executable, "-c", VICTIM, args.service],
                              stdout=subprocess.PIPE, text=True)
    check(victim.stdout.readline().strip() == "ready", "the victim client started")
    time.sleep(0.3)  # requests in flight
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    started = time.monotonic()
    for _ in range(200):
        client.infer("alpha_mlp", good)
    check(time.monotonic() - started < 10, "the server slowed down after a client died")
    fresh = ShmClient(args.service)
    check("probabilities" in fresh.infer("alpha_mlp", good), "a new client after the kill")
    # A client that yields its core while it waits (spin=0) gets the same answers.
    yielding = ShmClient(args.service, spin=0)
    check(np.array_equal(yielding.infer("alpha_mlp", good)["probabilities"],
                         fresh.infer("alpha_mlp", good)["probabilities"]),
          "a yielding client's answer differs")
    print("ok a client killed mid-request: the others are served")
    # Clients past the server's bound are told so, not that there is no server.
    extra, refusal = [], None
    for _ in range(64):
        try:
            extra.append(ShmClient(args.service))
        except ConnectionError as e:
            refusal = str(e)
            break
    check(refusal is not None and "takes no more clients" in refusal
          and "no tickserve server" not in refusal, f"the client past the bound: {refusal}")
    del extra
    print("ok the client past the bound is told the server takes no more clients")
    print("done")


if __name__ == "__main__":
    main()

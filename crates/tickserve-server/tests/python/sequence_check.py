#!/usr/bin/env python3
"""Stateful sequences through Triton's own Python clients, against onnxruntime.

    python crates/tickserve-server/tests/python/sequence_check.py --http 127.0.0.1:8000 \
        --grpc 127.0.0.1:8001 [--sequences 200] [--ticks 500] [--clients 8] \
        [--model seq_lstm_step|seq_lstm_window]

`seq_lstm_step` keeps h and c per sequence; `seq_lstm_window` keeps each sequence's last
30 ticks (a window, docs/sequences.md) and runs `seq_lstm` on them: its reference is
onnxruntime running `seq_lstm` on the window the client would have kept (zeros before
the first tick), and each answer must say how many ticks its window held
(`sequence_window_ticks`, gRPC and HTTP; min(t + 1, 30)). For the window model the
script also preloads windows: sequences whose first request writes a history of 29
ticks (`/sequences/write`), whose next tick must equal `seq_lstm` on those 29 ticks and
it. SEQUENCES sequences of TICKS ticks each are
sent interleaved from CLIENTS threads: half of the clients over unary gRPC
(tritonclient.grpc), the others but one over HTTP (tritonclient.http), and the last one
over one ModelStreamInfer stream (start_stream / async_stream_infer), all its sequences
on that stream. Ids alternate between numbers and strings. Sequences come in pairs fed
identical ticks under different ids (one numeric, one a string, on different
protocols), so state crossing between sequences would show; each pair agrees within
the tolerance (its two sequences run in different batches). Every tick's prediction
must equal onnxruntime running the sequence offline (the same step model, h and c
carried in numpy) within 1e-5: |got - want| <= 1e-5 * max(1, |want|). (Absolute below
1, where the other checks' floor is 1e-6: the server runs a tick in whatever bucket its
batch needs, whose kernels differ from the offline run's by an ulp or two, and the
state carries that difference into every later tick; predictions near zero then differ
by about 1e-7 absolute. The script prints the worst error seen.) The first tick says sequence_start, the last
sequence_end; the server keeps no sequence afterwards. Prints `done`.
Started by crates/tickserve-server/tests/server/features/sequences.rs (a smaller run); the full bar
(200 x 500 from 8 clients) is the default.
"""
import argparse
import json
import pathlib
import queue
import threading
import urllib.request

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from reference import check  # noqa: E402 (beside this script)

ROOT = pathlib.Path(__file__).resolve().parents[4]
FEATURES = 8
HIDDEN = 16
WINDOW = 30
TOLERANCE = 1e-5
# The model's tick input, and how onnxruntime predicts offline (set by --model).
MODELS = {"seq_lstm_step": "tick", "seq_lstm_window": "window"}
MODEL = "seq_lstm_step"
TICK = "tick"


def sequence_id(i):
    """Sequence i's id: numbers for even i, strings for odd."""
    return i + 1 if i % 2 == 0 else f"instrument-{i}"


def offline(ticks):
    """Predictions of every tick of every input stream (ticks: [streams, T, 8]): what the
    server must answer."""
    if MODEL == "seq_lstm_window":
        return offline_windows(ticks)
    session = ort.InferenceSession(str(ROOT / f"config/models/{MODEL}/1/model.onnx"))
    streams, length = ticks.shape[:2]
    h = np.zeros((streams, HIDDEN), np.float32)
    c = np.zeros((streams, HIDDEN), np.float32)
    out = np.zeros((streams, length), np.float32)
    for t in range(length):
        p, h, c = session.run(None, {"tick": ticks[:, t], "h_in": h, "c_in": c})
        out[:, t] = p[:, 0]
    return out


def offline_windows(ticks, history=None):
    """`seq_lstm` on each tick's window as a client would keep it: the last 30 ticks,
    zeros before the first (or `history` [streams, H, 8] before the first)."""
    session = ort.InferenceSession(str(ROOT / "config/models/seq_lstm/1/model.onnx"))
    streams, length = ticks.shape[:2]
    before = np.zeros((streams, WINDOW, FEATURES), np.float32)
    if history is not None:
        before[:, WINDOW - history.shape[1]:] = history
    window = before
    out = np.zeros((streams, length), np.float32)
    for t in range(length):
        window = np.concatenate([window[:, 1:], ticks[:, t:t + 1]], axis=1)
        out[:, t] = session.run(None, {"window": window})[0][:, 0]
    return out


def held(result, t):
    """Checks a window model's answer says how many ticks its window held."""
    if MODEL != "seq_lstm_window":
        return
    response = result.get_response()
    parameters = response["parameters"] if isinstance(response, dict) else response.parameters
    value = parameters["sequence_window_ticks"]
    value = value if isinstance(value, int) else value.uint64_param
    check(value == min(t + 1, WINDOW), f"tick {t}: sequence_window_ticks {value}")


def unary_worker(client_module, address, encoding=lambda t: {}):
    """A worker sending its sequences' ticks one request at a time through `client_module`
    (tritonclient.grpc or tritonclient.http) at `address`; `encoding(t)` are tick t's
    extra arguments for the input's data (HTTP alternates binary and JSON)."""
    def work(args, mine, ticks, got, errors):
        client = client_module.InferenceServerClient(address(args))
        try:
            for t in range(args.ticks):
                for i in mine:
                    x = client_module.InferInput(TICK, [1, FEATURES], "FP32")
                    x.set_data_from_numpy(ticks[i // 2, t:t + 1], **encoding(t))
                    result = client.infer(MODEL, [x], sequence_id=sequence_id(i),
                                          sequence_start=t == 0, sequence_end=t == args.ticks - 1)
                    got[i, t] = result.as_numpy("prediction")[0, 0]
                    held(result, t)
        except Exception as e:  # noqa: BLE001 (reported, then the check fails)
            errors.append(f"{client_module.__name__}: {e}")
    return work


grpc_worker = unary_worker(grpcclient, lambda args: args.grpc)
http_worker = unary_worker(httpclient, lambda args: args.http,
                           lambda t: {"binary_data": t % 2 == 0})


def stream_worker(args, mine, ticks, got, errors):
    client = grpcclient.InferenceServerClient(args.grpc)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for t in range(args.ticks):
            for i in mine:
                x = grpcclient.InferInput(TICK, [1, FEATURES], "FP32")
                x.set_data_from_numpy(ticks[i // 2, t:t + 1])
                client.async_stream_infer(MODEL, [x], request_id=f"{i}:{t}",
                                          sequence_id=sequence_id(i), sequence_start=t == 0,
                                          sequence_end=t == args.ticks - 1)
            for i in mine:
                result, error = answers.get(timeout=60)
                if error is not None:
                    raise RuntimeError(str(error))
                # Answers come in the order sent.
                sent = result.get_response().id
                check(sent == f"{i}:{t}", f"stream answer {sent} where {i}:{t} was next")
                got[i, t] = result.as_numpy("prediction")[0, 0]
                held(result, t)
    except Exception as e:  # noqa: BLE001
        errors.append(f"stream: {e}")
    finally:
        client.stop_stream()


def post(args, path, body):
    request = urllib.request.Request(f"http://{args.http}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def preloaded(args, rng):
    """Windows preloaded with 29 ticks of history (HTTP `/sequences/write`, JSON): each
    next tick equals `seq_lstm` offline on the history and the tick; a read shows the
    written ticks back. Returns how many were checked."""
    streams = 8
    history = rng.standard_normal((streams, WINDOW - 1, FEATURES)).astype(np.float32)
    tick = rng.standard_normal((streams, 1, FEATURES)).astype(np.float32)
    want = offline_windows(tick, history)[:, 0]
    client = httpclient.InferenceServerClient(args.http)
    for s in range(streams):
        seq = f"preloaded-{s}"
        post(args, f"/v2/models/{MODEL}/sequences/write", {
            "parameters": {"sequence_id": seq},
            "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, WINDOW - 1, FEATURES],
                        "data": history[s].ravel().tolist()}]})
        read = post(args, f"/v2/models/{MODEL}/sequences/read", {"parameters": {"sequence_id": seq}})
        written = np.array(read["outputs"][0]["data"], np.float32).reshape(WINDOW - 1, FEATURES)
        check(np.array_equal(written, history[s]), f"{seq}: the read window is not the written one")
        x = httpclient.InferInput(TICK, [1, FEATURES], "FP32")
        x.set_data_from_numpy(tick[s])
        result = client.infer(MODEL, [x], sequence_id=seq, sequence_end=True)
        got = float(result.as_numpy("prediction")[0, 0])
        check(abs(got - want[s]) <= TOLERANCE * max(1.0, abs(want[s])),
              f"{seq}: first tick after a preloaded history {got}, offline {want[s]}")
        held(result, WINDOW - 1)
    return streams


def main():
    global MODEL, TICK
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--sequences", type=int, default=200)
    p.add_argument("--ticks", type=int, default=500)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--model", choices=sorted(MODELS), default=MODEL)
    args = p.parse_args()
    MODEL, TICK = args.model, MODELS[args.model]
    check(args.sequences % 2 == 0 and args.clients >= 3, "an even count of sequences, 3+ clients")
    rng = np.random.default_rng(14)
    # One input stream per pair of sequences.
    ticks = rng.standard_normal((args.sequences // 2, args.ticks, FEATURES)).astype(np.float32)
    want = offline(ticks)
    got = np.full((args.sequences, args.ticks), np.nan, np.float32)
    errors = []
    # Client k takes sequences k, k + clients, ...: a pair's two sequences land on
    # different clients, running at the same time.
    kinds = ([grpc_worker] * (args.clients // 2)
             + [http_worker] * (args.clients - args.clients // 2 - 1) + [stream_worker])
    threads = [threading.Thread(target=kind, args=(args, list(range(k, args.sequences, args.clients)),
                                                   ticks, got, errors))
               for k, kind in enumerate(kinds)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    check(not errors, "; ".join(errors))
    check(not np.isnan(got).any(), "a tick was not answered")
    expected = want[np.arange(args.sequences) // 2]
    error = np.abs(got.astype(np.float64) - expected)
    bound = TOLERANCE * np.maximum(1.0, np.abs(expected))
    worst = np.unravel_index(np.argmax(error / bound), error.shape)
    check(np.all(error <= bound),
          f"sequence {sequence_id(worst[0])} tick {worst[1]}: {got[worst]} where onnxruntime "
          f"says {expected[worst]}")
    # A pair's two sequences ran in different batches, so they agree within the same
    # tolerance, not bit for bit.
    pair_error = np.abs(got[0::2].astype(np.float64) - got[1::2])
    check(np.all(pair_error <= TOLERANCE * np.maximum(1.0, np.abs(got[0::2]))),
          "two sequences fed the same ticks under different ids answered differently")
    with urllib.request.urlopen(f"http://{args.http}/v2/models/{MODEL}/sequences",
                                timeout=30) as response:
        left = json.loads(response.read())["sequences"]
    check(left == [], f"sequences left after their end: {left[:5]}")
    if MODEL == "seq_lstm_window":
        print(f"{preloaded(args, rng)} preloaded windows: each first tick equals onnxruntime "
              "on the written history and the tick")
    print(f"{MODEL}: {args.sequences} sequences x {args.ticks} ticks from {args.clients} clients "
          f"({args.clients // 2} gRPC, {args.clients - args.clients // 2 - 1} HTTP, 1 stream): "
          f"every tick equals onnxruntime offline within 1e-5 (worst absolute error "
          f"{error.max():.2e}, between a pair {pair_error.max():.2e})")
    print("done")


if __name__ == "__main__":
    main()

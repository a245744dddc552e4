#!/usr/bin/env python3
"""Stateful sequences through Triton's own Python clients, against onnxruntime.

    python crates/tickserve-server/tests/python/sequence_check.py --http 127.0.0.1:8000 \
        --grpc 127.0.0.1:8001 [--sequences 200] [--ticks 500] [--clients 8]

`seq_lstm_step` keeps h and c per sequence. SEQUENCES sequences of TICKS ticks each are
sent interleaved from CLIENTS threads: half of the clients over unary gRPC
(tritonclient.grpc), the others but one over HTTP (tritonclient.http), and the last one
over one ModelStreamInfer stream (start_stream / async_stream_infer), all its sequences
on that stream. Ids alternate between numbers and strings. Sequences come in pairs fed
identical ticks under different ids (one numeric, one a string, on different
protocols), so state crossing between sequences would show; each pair agrees within
the tolerance (its two sequences run in different batches). Every tick's prediction
must equal onnxruntime running the sequence offline (the same step model, h and c
carried in numpy) within 1e-5: |got - want| <= 1e-5 * max(1, |want|). (Absolute below
1, where the other checks' floor is 1e-7: the server runs a tick in whatever bucket its
batch needs, whose kernels differ from the offline run's by an ulp or two, and the
state carries that difference into every later tick; predictions near zero then differ
by about 1e-7 absolute. The script prints the worst error seen.) The first tick says sequence_start, the last
sequence_end; the server keeps no sequence afterwards. Prints `done`.
Started by crates/tickserve-server/tests/sequences.rs (a smaller run); the full bar
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
MODEL = "seq_lstm_step"
FEATURES = 8
HIDDEN = 16
TOLERANCE = 1e-5


def sequence_id(i):
    """Sequence i's id: numbers for even i, strings for odd."""
    return i + 1 if i % 2 == 0 else f"instrument-{i}"


def offline(ticks):
    """Predictions of every tick of every input stream (ticks: [streams, T, 8]), with h
    and c carried in numpy: what the server must answer."""
    session = ort.InferenceSession(str(ROOT / f"config/models/{MODEL}/1/model.onnx"))
    streams, length = ticks.shape[:2]
    h = np.zeros((streams, HIDDEN), np.float32)
    c = np.zeros((streams, HIDDEN), np.float32)
    out = np.zeros((streams, length), np.float32)
    for t in range(length):
        p, h, c = session.run(None, {"tick": ticks[:, t], "h_in": h, "c_in": c})
        out[:, t] = p[:, 0]
    return out


def unary_worker(client_module, address, encoding=lambda t: {}):
    """A worker sending its sequences' ticks one request at a time through `client_module`
    (tritonclient.grpc or tritonclient.http) at `address`; `encoding(t)` are tick t's
    extra arguments for the input's data (HTTP alternates binary and JSON)."""
    def work(args, mine, ticks, got, errors):
        client = client_module.InferenceServerClient(address(args))
        try:
            for t in range(args.ticks):
                for i in mine:
                    x = client_module.InferInput("tick", [1, FEATURES], "FP32")
                    x.set_data_from_numpy(ticks[i // 2, t:t + 1], **encoding(t))
                    result = client.infer(MODEL, [x], sequence_id=sequence_id(i),
                                          sequence_start=t == 0, sequence_end=t == args.ticks - 1)
                    got[i, t] = result.as_numpy("prediction")[0, 0]
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
                x = grpcclient.InferInput("tick", [1, FEATURES], "FP32")
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
    except Exception as e:  # noqa: BLE001
        errors.append(f"stream: {e}")
    finally:
        client.stop_stream()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--sequences", type=int, default=200)
    p.add_argument("--ticks", type=int, default=500)
    p.add_argument("--clients", type=int, default=8)
    args = p.parse_args()
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
    print(f"{args.sequences} sequences x {args.ticks} ticks from {args.clients} clients "
          f"({args.clients // 2} gRPC, {args.clients - args.clients // 2 - 1} HTTP, 1 stream): "
          f"every tick equals onnxruntime offline within 1e-5 (worst absolute error "
          f"{error.max():.2e}, between a pair {pair_error.max():.2e})")
    print("done")


if __name__ == "__main__":
    main()

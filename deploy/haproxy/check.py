#!/usr/bin/env python3
"""Three tickserve replicas behind HAProxy (deploy/haproxy/haproxy.cfg) on loopback:
every tick of a sequence reaches the replica that holds its state.

    .venv/bin/python deploy/haproxy/check.py [BINARY]     # default: target/debug/tickserve

40 sequences of 20 ticks of `seq_lstm_step`, half over HTTP and half over gRPC
(tritonclient, the `tickserve-sequence-id` header on every tick), through the balancer.
Passes when every tick is answered; every answer equals the same sequence's answer from
one server alone (within 1e-6); each sequence lives on exactly one replica (each
replica's sequence list); the sequences are spread over more than one replica; the
control, a sequence sent without the header is spread too and fails; and the operator's
endpoints (halt, resume, sequence state, the repository, /metrics) answer 404 on the
public fronts and are reached through the admin front.
"""
import pathlib
import sys
import tempfile
import json
import time
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
# What only operators may reach: refused on the balancer's public fronts.
OPERATOR = [("POST", "/v2/models/seq_lstm_step/versions/1/halt"),
            ("POST", "/v2/models/seq_lstm_step/resume"),
            ("GET", "/v2/models/seq_lstm_step/sequences"),
            ("POST", "/v2/models/seq_lstm_step/sequences/read"),
            ("POST", "/v2/repository/index"),
            ("GET", "/metrics")]


def status(method, url):
    """The HTTP status `url` answers `method` with (an empty JSON body for a POST)."""
    data = b"{}" if method == "POST" else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "scaleout"))
from balancer import Balancer  # noqa: E402
from server import Server  # noqa: E402

SEQUENCES = 40
TICKS = 20
MODEL = "seq_lstm_step"


def ticks(sequence):
    return np.random.default_rng(sequence).uniform(-1, 1, (TICKS, 8)).astype(np.float32)


def predict(client, module, sequence, t, tick, header):
    x = module.InferInput("tick", [1, 8], "FP32")
    x.set_data_from_numpy(tick.reshape(1, 8))
    headers = {"tickserve-sequence-id": str(sequence)} if header else None
    result = client.infer(MODEL, [x], sequence_id=sequence, sequence_start=(t == 0),
                          headers=headers)
    return float(result.as_numpy("prediction")[0, 0])


def run(http_address, grpc_address, header):
    """Every sequence's predictions, sequences alternating HTTP and gRPC."""
    http = httpclient.InferenceServerClient(http_address)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    out = {}
    for sequence in range(1, SEQUENCES + 1):
        client, module = (http, httpclient) if sequence % 2 else (grpc, grpcclient)
        out[sequence] = [predict(client, module, sequence, t, tick, header)
                         for t, tick in enumerate(ticks(sequence))]
    return out


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/debug/tickserve")
    config = ROOT / "config/tickserve.toml"
    with tempfile.TemporaryDirectory(prefix="tickserve-haproxy-") as work:
        work = pathlib.Path(work)
        servers = [Server(config=config, binary=binary, log=work / f"r{i}.log") for i in range(1, 4)]
        for s in servers:
            s.start()
        alone = Server(config=config, binary=binary, log=work / "alone.log")
        alone.start()
        lb = Balancer(work, [(s.http_port, s.grpc_port) for s in servers])
        try:
            lb.__enter__()
            started = time.monotonic()
            balanced = run(lb.http, lb.grpc, header=True)
            elapsed = time.monotonic() - started
            single = run(f"127.0.0.1:{alone.http_port}", f"127.0.0.1:{alone.grpc_port}",
                         header=False)
            worst = max(abs(a - b) for s in balanced for a, b in zip(balanced[s], single[s]))
            # The control: without the header the balancer spreads a sequence's
            # ticks, and a tick that reaches a replica without its state fails.
            lost = None
            http = httpclient.InferenceServerClient(lb.http)
            try:
                for t, tick in enumerate(ticks(SEQUENCES + 1)):
                    predict(http, httpclient, SEQUENCES + 1, t, tick, header=False)
            except Exception as e:  # noqa: BLE001  (tritonclient's error type varies)
                lost = str(e)
            assert lost and "sequence" in lost, f"without the header every tick was answered: {lost}"
            held = []
            for s in servers:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{s.http_port}/v2/models/{MODEL}/sequences", timeout=5) as r:
                    listed = json.loads(r.read())["sequences"]
                # The control's sequence, started on whichever replica, is not counted.
                held.append({int(q["sequence_id"]) for q in listed} - {SEQUENCES + 1})
            print(f"{SEQUENCES} sequences x {TICKS} ticks through HAProxy in {elapsed:.1f} s; "
                  f"sequences per replica: {[len(h) for h in held]}; "
                  f"largest difference from one server alone: {worst:.2e}")
            everywhere = set().union(*held)
            assert everywhere == set(range(1, SEQUENCES + 1)), f"sequences held: {sorted(everywhere)}"
            assert sum(len(h) for h in held) == SEQUENCES, "a sequence lives on two replicas"
            assert sum(1 for h in held if h) >= 2, "every sequence went to one replica"
            assert worst <= 1e-6, f"answers differ from one server's by {worst}"
            for method, path in OPERATOR:
                assert status(method, f"http://{lb.http}{path}") == 404, f"{path} is public"
            grpc = grpcclient.InferenceServerClient(lb.grpc)
            try:
                grpc.get_model_repository_index()
                raise AssertionError("the repository index is public over gRPC")
            except grpcclient.InferenceServerException:
                pass
            assert status("GET", f"http://{lb.admin}/metrics") == 200, "no /metrics on the admin front"
            print("haproxy check: passed")
        finally:
            lb.__exit__()
            alone.stop()
            for s in servers:
                s.stop()


if __name__ == "__main__":
    main()

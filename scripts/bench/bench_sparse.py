#!/usr/bin/env python3
"""Sparse traffic: one-row alpha_mlp requests in a closed loop, then one every 1 ms, 10 ms,
100 ms and 1 s, over HTTP and gRPC, in one run.

    cargo build --release -p tickserve-server
    .venv/bin/python scripts/bench/bench_sparse.py [--config FILE] [--label NAME] [--spin]

A trading client's ticks come sparse: an instrument that ticks every 50 ms sends a
request after the server has sat idle for 50 ms. For each spacing the script reports
the server's compute time (its `tickserve-compute-us` answer header / gRPC metadata:
copying rows in, the engine's run, copying out) and the end-to-end time the client
measured (`time.perf_counter_ns` around the call), p50 and p99, and the server's CPU
per second while idle (its /proc time over 10 s with no request). Between requests the
client sleeps (`time.sleep`), as a client waiting for its next tick does; `--spin`
makes it busy-wait instead, so that only the server's side goes cold.

The client is one persistent HTTP/1.1 connection (http.client) and one gRPC channel
(grpcio with tritonclient's stubs), one request at a time. `--warmer-ms N` adds a second
client (its own HTTP connection, in a thread) sending the same request every N ms for
the whole run: what real traffic beside the sparse client does to it, the most any
keep-warm inside the server could do. Prints a Markdown table.

`--floor` sends the health check instead of the inference (HTTP `GET /v2/health/live`
on the same connection, gRPC `ServerLive` on the same channel), at the same spacings:
the client's, the kernel's and the transport's share of the end-to-end time, which no
model run touches.

`--first N` measures the first request instead: N times per protocol, a fresh server,
a client connected once it is ready (the connection is not timed), one request, then
200 more and the closed loop's median over 200 after them as the steady figure:

    .venv/bin/python scripts/bench/bench_sparse.py --first 5
"""
import argparse
import http.client
import json
import pathlib
import statistics
import sys
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_common import cpu_seconds  # noqa: E402
from server import DEFAULT_CONFIG, Server  # noqa: E402

# (label, seconds between requests, requests)
SPACINGS = [("closed loop", 0.0, 2000), ("every 1 ms", 0.001, 1000), ("every 10 ms", 0.01, 300),
            ("every 100 ms", 0.1, 60), ("every 1 s", 1.0, 12)]
FEATURES = 50


def wait(seconds, spin):
    if seconds <= 0:
        return
    if not spin:
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


class Http:
    def __init__(self, port):
        self.connection = http.client.HTTPConnection("127.0.0.1", port)
        self.connection.connect()
        x = np.random.default_rng(0).standard_normal(FEATURES).astype(np.float32)
        self.body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                            "shape": [1, FEATURES],
                                            "data": [float(v) for v in x]}]}).encode()

    def call(self):
        """(end-to-end ns, compute µs)."""
        started = time.perf_counter_ns()
        self.connection.request("POST", "/v2/models/alpha_mlp/infer", body=self.body,
                                headers={"Content-Type": "application/json"})
        response = self.connection.getresponse()
        response.read()
        elapsed = time.perf_counter_ns() - started
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return elapsed, int(response.getheader("tickserve-compute-us"))

    def live(self):
        """(end-to-end ns, 0): `GET /v2/health/live`, the same connection's floor."""
        started = time.perf_counter_ns()
        self.connection.request("GET", "/v2/health/live")
        response = self.connection.getresponse()
        response.read()
        elapsed = time.perf_counter_ns() - started
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return elapsed, 0


class Grpc:
    def __init__(self, port):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.live_request = service_pb2.ServerLiveRequest()
        x = np.random.default_rng(0).standard_normal((1, FEATURES)).astype(np.float32)
        self.request = service_pb2.ModelInferRequest(model_name="alpha_mlp")
        self.request.inputs.add(name="features", datatype="FP32", shape=[1, FEATURES])
        self.request.raw_input_contents.append(x.tobytes())

    def call(self):
        started = time.perf_counter_ns()
        _, call = self.stub.ModelInfer.with_call(self.request, timeout=30)
        elapsed = time.perf_counter_ns() - started
        metadata = dict(call.initial_metadata())
        return elapsed, int(metadata["tickserve-compute-us"])

    def live(self):
        """(end-to-end ns, 0): `ServerLive`, the same channel's floor."""
        started = time.perf_counter_ns()
        self.stub.ServerLive(self.live_request, timeout=30)
        return time.perf_counter_ns() - started, 0


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def measure(client, spin, scale, floor=False):
    call = client.live if floor else client.call
    rows = []
    for _ in range(200):
        call()
    for label, seconds, count in SPACINGS:
        count = max(5, int(count * scale))
        e2e, compute = [], []
        for _ in range(count):
            wait(seconds, spin)
            elapsed, us = call()
            e2e.append(elapsed / 1000)
            compute.append(us)
        rows.append((label, statistics.median(compute), percentile(compute, 0.99),
                     statistics.median(e2e), percentile(e2e, 0.99), count))
    return rows


def first_requests(config, restarts):
    """Per protocol, each restart's first request and the steady closed loop after it:
    [(protocol, [(first compute, first e2e)], steady compute p50, steady e2e p50)]."""
    results = []
    for protocol, client_of in (("HTTP", lambda s: Http(s.http_port)),
                                ("gRPC", lambda s: Grpc(s.grpc_port))):
        firsts, steady_compute, steady_e2e = [], [], []
        for _ in range(restarts):
            with Server(config=config) as server:
                client = client_of(server)
                elapsed, us = client.call()
                firsts.append((us, elapsed / 1000))
                for _ in range(200):
                    client.call()
                closed = [client.call() for _ in range(200)]
                steady_compute.append(statistics.median(us for _, us in closed))
                steady_e2e.append(statistics.median(ns / 1000 for ns, _ in closed))
        results.append((protocol, firsts, statistics.median(steady_compute),
                        statistics.median(steady_e2e)))
    return results


def print_first(results):
    print("| protocol | first request compute (µs), each restart | first e2e (µs), each restart "
          "| steady compute p50 (µs) | steady e2e p50 (µs) | first / steady, median (compute, e2e) |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for protocol, firsts, compute, e2e in results:
        first_compute = statistics.median(c for c, _ in firsts)
        first_e2e = statistics.median(e for _, e in firsts)
        print(f"| {protocol} | {', '.join(f'{c:.0f}' for c, _ in firsts)} "
              f"| {', '.join(f'{e:.0f}' for _, e in firsts)} | {compute:.0f} | {e2e:.0f} "
              f"| {first_compute / compute:.1f}, {first_e2e / e2e:.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--label", default="")
    p.add_argument("--spin", action="store_true", help="busy-wait between requests")
    p.add_argument("--scale", type=float, default=1.0, help="requests per spacing, scaled")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured")
    p.add_argument("--warmer-ms", type=float, default=0.0,
                   help="a second client sending a request every this many ms")
    p.add_argument("--floor", action="store_true",
                   help="send the health check (HTTP GET /v2/health/live, gRPC ServerLive) "
                        "instead of the inference: the transport's own figures")
    p.add_argument("--first", type=int, default=0, metavar="N",
                   help="measure the first request after ready instead, over N restarts")
    args = p.parse_args()
    if args.first > 0:
        print_first(first_requests(args.config, args.first))
        return
    with Server(config=args.config) as server:
        stop = threading.Event()
        if args.warmer_ms > 0:
            warmer = Http(server.http_port)

            def warm():
                while not stop.is_set():
                    warmer.call()
                    time.sleep(args.warmer_ms / 1000)
            threading.Thread(target=warm, daemon=True).start()
        http_rows = measure(Http(server.http_port), args.spin, args.scale, args.floor)
        grpc_rows = measure(Grpc(server.grpc_port), args.spin, args.scale, args.floor)
        stop.set()
        before = cpu_seconds(server.pid)
        time.sleep(args.idle)
        idle = (cpu_seconds(server.pid) - before) / args.idle
    label = f" ({args.label})" if args.label else ""
    print(f"| protocol{label} | spacing | requests | compute p50 (µs) | compute p99 (µs) "
          "| end-to-end p50 (µs) | end-to-end p99 (µs) | e2e p50 / closed loop |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for protocol, rows in (("HTTP", http_rows), ("gRPC", grpc_rows)):
        closed = rows[0][3]
        for label, c50, c99, e50, e99, count in rows:
            print(f"| {protocol} | {label} | {count} | {c50:.0f} | {c99:.0f} | {e50:.0f} "
                  f"| {e99:.0f} | {e50 / closed:.2f} |")
    print(f"\nserver CPU while idle: {idle * 1000:.1f} ms per second ({idle * 100:.2f} % of a core)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Stateful ticks and server-kept windows against resending the window, in one run.

    cargo build --release -p tickserve-server && .venv/bin/python scripts/bench/bench_sequences.py

Starts the release server (target/release/tickserve, or $TICKSERVE_BIN) on the sample
repository through scripts/bench/server.py, and runs perf_analyzer (../shared/tools/perf_analyzer)
over gRPC at concurrency 1 and 16:

  - window: `seq_lstm`, each request the whole 30-tick window [1, 30, 8] (what a client
    does without server-side state: 30 LSTM steps per prediction);
  - stateful: `seq_lstm_step`, each request one tick [1, 8] of a sequence, the server
    keeping h and c (`--sequence-length 100 --sequence-id-range 1:100000`: perf_analyzer
    starts and ends sequences itself, as it does against Triton);
  - windowed: `seq_lstm_window`, each request one tick [1, 8] of a sequence, the server
    keeping its last 30 ticks and running `seq_lstm` on them (the same sequence flags).

All three give the prediction after the latest tick (tests/server/features/sequences.rs and
tests/server/features/windows.rs check they are equal). For each: the size of the request message (the
protobuf ModelInferRequest perf_analyzer sends, raw tensor contents, sequence
parameters included; gRPC adds 5 bytes and HTTP/2 framing), throughput,
p50 / p99 (perf_analyzer's client-side latency), the server's compute per request
(perf_analyzer's server-side "compute infer"), and the CPU time per request of the
server (from /proc) and of the client (its rusage). Then the two
models alone in onnxruntime (one thread) at 1, 16 and 64 rows per run: what the state
saves where no network is in the way. Prints Markdown tables; raw outputs go to
target/bench/sequences_*.
"""
import argparse
import csv
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PERF_ANALYZER = ROOT.parent / "shared/tools/perf_analyzer"
OUT = ROOT / "target/bench"
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_common import children_cpu, cpu_seconds, metric_sum  # noqa: E402
from server import Server  # noqa: E402




def request_bytes(model, extra):
    """The ModelInferRequest message of one request: the model's input as raw contents,
    and the sequence parameters when `extra` asks for sequences."""
    from tritonclient.grpc import service_pb2
    shapes = {"seq_lstm": [1, 30, 8], "seq_lstm_step": [1, 8], "seq_lstm_window": [1, 8]}
    names = {"seq_lstm": "window", "seq_lstm_step": "tick", "seq_lstm_window": "window"}
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=names[model], datatype="FP32", shape=shapes[model])
    count = 1
    for d in tensor.shape:
        count *= d
    request.raw_input_contents.append(b"\0" * 4 * count)
    if extra:
        request.parameters["sequence_id"].uint64_param = 12345
        request.parameters["sequence_start"].bool_param = False
        request.parameters["sequence_end"].bool_param = False
    return request.ByteSize()


def run(server, name, model, concurrency, interval_ms, extra):
    csv_path = OUT / f"sequences_{name}_c{concurrency}.csv"
    log = OUT / f"sequences_{name}_c{concurrency}.txt"
    command = [str(PERF_ANALYZER), "-m", model, "-u", f"127.0.0.1:{server.grpc_port}", "-i", "grpc",
               "--concurrency-range", str(concurrency), "--measurement-interval", str(interval_ms),
               "-f", str(csv_path)] + extra
    served = metric_sum(server.http_port, "tickserve_requests_total", f'model="{model}"')
    server_cpu, client_cpu = cpu_seconds(server.pid), children_cpu()
    with open(log, "w") as f:
        subprocess.run(command, check=True, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    server_cpu = cpu_seconds(server.pid) - server_cpu
    client_cpu = children_cpu() - client_cpu
    served = metric_sum(server.http_port, "tickserve_requests_total", f'model="{model}"') - served
    row = next(csv.DictReader(open(csv_path)))
    return {
        "rps": float(row["Inferences/Second"]),
        "p50": float(row["p50 latency"]),
        "p99": float(row["p99 latency"]),
        "compute": float(row["Server Compute Infer"]),
        "server_us": 1e6 * server_cpu / max(served, 1),
        "bytes": request_bytes(model, extra),
        "client_us": 1e6 * client_cpu / max(served, 1),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--interval", type=int, default=5000, help="measurement window (ms)")
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        config = pathlib.Path(work) / "tickserve.toml"
        config.write_text(
            f'[server]\nhost = "127.0.0.1"\n'
            f'[runtime]\nonnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"\n'
            f'[repository]\npath = "{ROOT / "config/models"}"\n')
        with Server(config=config, log=pathlib.Path(work) / "server.log") as server:
            for concurrency in (1, 16):
                results[("window", concurrency)] = run(
                    server, "window", "seq_lstm", concurrency, args.interval, [])
                sequences = ["--sequence-length", "100", "--sequence-id-range", "1:100000"]
                results[("stateful", concurrency)] = run(
                    server, "stateful", "seq_lstm_step", concurrency, args.interval, sequences)
                results[("windowed", concurrency)] = run(
                    server, "windowed", "seq_lstm_window", concurrency, args.interval, sequences)
    print("| request | concurrency | request message (bytes) | inferences/s | p50 (µs) | p99 (µs) "
          "| server compute / request (µs) | server CPU / request (µs) "
          "| client CPU / request (µs) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for concurrency in (1, 16):
        for name, label in (("window", "`seq_lstm`, the 30-tick window"),
                            ("stateful", "`seq_lstm_step`, one tick (state in the server)"),
                            ("windowed", "`seq_lstm_window`, one tick (window in the server)")):
            r = results[(name, concurrency)]
            print(f"| {label} | {concurrency} | {r['bytes']:.0f} | {r['rps']:.0f} | {r['p50']:.0f} "
                  f"| {r['p99']:.0f} | {r['compute']:.0f} | {r['server_us']:.0f} "
                  f"| {r['client_us']:.0f} |")
    for concurrency in (1, 16):
        w = results[("window", concurrency)]
        for name in ("stateful", "windowed"):
            s = results[(name, concurrency)]
            print(f"\nconcurrency {concurrency}: the {name} tick costs {s['bytes'] / w['bytes']:.2f}x "
                  f"the window's bytes, {s['p50'] / w['p50']:.2f}x its p50, "
                  f"{s['p99'] / w['p99']:.2f}x its p99, "
                  f"{s['compute'] / w['compute']:.2f}x its server compute, "
                  f"{s['server_us'] / w['server_us']:.2f}x its server CPU per request")
    engine_alone()


def engine_alone():
    """The models alone in onnxruntime (Python, one thread), per run of B rows: what the
    state saves where the network is not in the way."""
    import numpy as np
    import onnxruntime as ort
    import time
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    models = ROOT / "config/models"
    window = ort.InferenceSession(str(models / "seq_lstm/1/model.onnx"), options)
    step = ort.InferenceSession(str(models / "seq_lstm_step/1/model.onnx"), options)

    def per_run(run, n=2000):
        for _ in range(200):
            run()
        started = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - started) / n * 1e6

    print("\n| rows per run | `seq_lstm` window run (µs) | `seq_lstm_step` tick run (µs) | tick / window |")
    print("| ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(0)
    for rows in (1, 16, 64):
        x = rng.standard_normal((rows, 30, 8)).astype(np.float32)
        tick = x[:, -1]
        h = np.zeros((rows, 16), np.float32)
        w = per_run(lambda: window.run(None, {"window": x}))
        s = per_run(lambda: step.run(None, {"tick": tick, "h_in": h, "c_in": h}))
        print(f"| {rows} | {w:.1f} | {s:.1f} | {s / w:.2f}x |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The shared-memory front end against gRPC and HTTP, in one run.

    cargo build --release -p tickserve-server -p tickserve-client --example latency
    .venv/bin/python scripts/bench/bench_shm.py [--seconds 5] [--sparse-seconds 30]

One-row `alpha_mlp` requests against the release server (target/release/tickserve, or
$TICKSERVE_BIN) with `[shm] enabled = true`, started through scripts/bench/server.py:

  - closed loop, concurrency 1 and 4: shared memory through the Rust client
    (target/release/examples/latency) and the Python client (tickserve_client, one
    process per stream), gRPC through the Rust client and through perf_analyzer, HTTP
    through perf_analyzer; p50 / p99, and the CPU per request of the server (from /proc)
    and of the client (its own);
  - sparse traffic, one request every 10 ms for --sparse-seconds, over shared memory and
    gRPC (Rust client) sleeping between requests, with the front end's spinning off
    (`shm.spin = "0us"`: its thread sleeps until a client wakes it) and on (`shm.spin =
    "20ms"`: it never sleeps between requests 10 ms apart), each in a server of its own;
    and, spinning on, a shared-memory client that spins between requests too.

Prints Markdown tables; raw outputs go to target/bench/shm_*.
"""
import argparse
import csv
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PERF_ANALYZER = ROOT.parent / "shared/tools/perf_analyzer"
LATENCY = ROOT / "target/release/examples/latency"
OUT = ROOT / "target/bench"
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_common import children_cpu, cpu_seconds, metric_sum  # noqa: E402
from server import Server  # noqa: E402

PYTHON_WORKER = """
import json, os, sys, time
import numpy as np
from tickserve_client import ShmClient
service, seconds = sys.argv[1], float(sys.argv[2])
client = ShmClient(service)
x = np.sin(np.arange(50, dtype=np.float32) * 0.1).reshape(1, 50)
for _ in range(200):
    client.infer("alpha_mlp", {"features": x})
lat = []
cpu = time.process_time()
started = time.perf_counter()
while time.perf_counter() - started < seconds:
    t0 = time.perf_counter_ns()
    client.infer("alpha_mlp", {"features": x})
    lat.append(time.perf_counter_ns() - t0)
print(json.dumps({"lat": lat, "cpu": time.process_time() - cpu}))
"""




def served(server):
    return metric_sum(server.http_port, "tickserve_requests_total", 'model="alpha_mlp"')


def measure(server, run):
    """Runs `run()` -> (p50 µs, p99 µs, requests, client CPU µs/request or None); adds the
    server's CPU per request over it."""
    before, cpu = served(server), cpu_seconds(server.pid)
    p50, p99, requests, client_us = run()
    server_us = 1e6 * (cpu_seconds(server.pid) - cpu) / max(served(server) - before, 1)
    return {"p50": p50, "p99": p99, "requests": requests, "client_us": client_us,
            "server_us": server_us}


def rust(server, mode, concurrency, seconds, interval_us=0, wait="sleep"):
    target = "tickserve" if mode == "shm" else f"http://127.0.0.1:{server.grpc_port}"

    def run():
        line = subprocess.run([str(LATENCY), mode, target, str(concurrency), str(seconds),
                               str(interval_us), wait], check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
        r = json.loads(line)
        return r["p50_us"], r["p99_us"], r["requests"], r["client_cpu_us"]
    return measure(server, run)


def python_shm(server, concurrency, seconds):
    def run():
        procs = [subprocess.Popen([str(ROOT / ".venv/bin/python"), "-c", PYTHON_WORKER,
                                   "tickserve", str(seconds)], stdout=subprocess.PIPE, text=True)
                 for _ in range(concurrency)]
        results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        lat = sorted(v for r in results for v in r["lat"])
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000  # noqa: E731
        cpu = sum(r["cpu"] for r in results)
        return q(0.5), q(0.99), len(lat), 1e6 * cpu / max(len(lat), 1)
    return measure(server, run)


def perf_analyzer(server, protocol, concurrency, seconds):
    name = f"shm_pa_{protocol}_c{concurrency}"
    csv_path, log = OUT / f"{name}.csv", OUT / f"{name}.txt"
    url = (f"127.0.0.1:{server.grpc_port}" if protocol == "grpc"
           else f"127.0.0.1:{server.http_port}")

    def run():
        client_cpu = children_cpu()
        with open(log, "w") as f:
            subprocess.run([str(PERF_ANALYZER), "-m", "alpha_mlp", "-u", url, "-i", protocol,
                            "--concurrency-range", str(concurrency), "--measurement-interval",
                            str(int(seconds * 1000)), "--stability-percentage", "50",
                            "--max-trials", "20", "-f", str(csv_path)],
                           check=True, stdout=f, stderr=subprocess.STDOUT)
        row = next(csv.DictReader(open(csv_path)))
        requests = float(row["Inferences/Second"]) * seconds
        return (float(row["p50 latency"]), float(row["p99 latency"]), int(requests), None)
    result = measure(server, run)
    return result


def config(work, spin):
    path = work / f"shm_{spin}.toml"
    path.write_text(
        f'[server]\nhost = "127.0.0.1"\n'
        f'[runtime]\nonnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"\n'
        f'[repository]\npath = "{ROOT / "config/models"}"\n'
        f'[shm]\nenabled = true\nspin = "{spin}"\n')
    return path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--sparse-seconds", type=float, default=30.0)
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        with Server(config=config(work, "50us"), log=work / "closed.log") as server:
            for c in (1, 4):
                rows.append(("shared memory, Rust client", c, rust(server, "shm", c, args.seconds)))
                rows.append(("shared memory, Python client", c, python_shm(server, c, args.seconds)))
                rows.append(("gRPC, Rust client", c, rust(server, "grpc", c, args.seconds)))
                rows.append(("gRPC, perf_analyzer", c, perf_analyzer(server, "grpc", c, args.seconds)))
                rows.append(("HTTP, perf_analyzer", c, perf_analyzer(server, "http", c, args.seconds)))
        sparse = []
        for spin, label in (("0us", "off"), ("20ms", "on")):
            with Server(config=config(work, spin), log=work / f"sparse_{spin}.log") as server:
                for mode in ("shm", "grpc"):
                    sparse.append((mode, label, "sleeps",
                                   rust(server, mode, 1, args.sparse_seconds, 10_000)))
                if label == "on":
                    sparse.append(("shm", label, "spins",
                                   rust(server, "shm", 1, args.sparse_seconds, 10_000, "spin")))
    print("| path | concurrency | p50 (µs) | p99 (µs) | requests | server CPU / request (µs) "
          "| client CPU / request (µs) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, c, r in rows:
        client = f"{r['client_us']:.0f}" if r["client_us"] is not None else "—"
        print(f"| {label} | {c} | {r['p50']:.1f} | {r['p99']:.1f} | {r['requests']} "
              f"| {r['server_us']:.1f} | {client} |")
    for c in (1, 4):
        shm = next(r for label, cc, r in rows if cc == c and label.startswith("shared memory, Rust"))
        grpc = next(r for label, cc, r in rows if cc == c and label == "gRPC, Rust client")
        print(f"\nconcurrency {c}: shared memory's p50 is {grpc['p50'] / shm['p50']:.1f}x lower "
              f"than gRPC's (Rust clients)")
    print("\n| sparse (one request / 10 ms) | front-end spin | client between requests | p50 (µs) "
          "| p99 (µs) | requests | server CPU / request (µs) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for mode, label, wait, r in sparse:
        print(f"| {'shared memory' if mode == 'shm' else 'gRPC'} | {label} | {wait} "
              f"| {r['p50']:.1f} | {r['p99']:.1f} | {r['requests']} | {r['server_us']:.1f} |")
    json.dump({"closed": [(name, c, r) for name, c, r in rows], "sparse": sparse},
              open(OUT / "shm.json", "w"), indent=1)


if __name__ == "__main__":
    main()

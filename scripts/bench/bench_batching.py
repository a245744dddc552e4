#!/usr/bin/env python3
"""The dynamic batcher's benchmark: batched against unbatched, and an open-loop overload.

    python3 scripts/bench/bench_batching.py                 # about 6 minutes
    python3 scripts/bench/bench_batching.py --quick         # 2 s measurement windows, about 4 minutes

Starts the release server (target/release/tickserve, or $TICKSERVE_BIN; build it first:
cargo build --release -p tickserve-server) through scripts/bench/server.py on the sample
repository twice:

  - unbatched: every bucket but 1 removed (`buckets = [1]`): each request is its own run;
  - batched: the shipped defaults (buckets 1..64, max_queue_delay 0, one executor).

For each it runs perf_analyzer (../shared/tools/perf_analyzer) over gRPC on alpha_mlp,
one row per request, at concurrency 1, 8 and 32, in two placements:

  - shared: server and perf_analyzer on both cores, as the OS schedules them;
  - pinned: the server on core 0, perf_analyzer on core 1 (taskset; on a larger machine
    pick the cores with --server-cpus and --client-cpus, e.g. 0-3 and 4-15).

and reports throughput, p50 / p99, the engine runs per request (perf_analyzer's
server-side execution / inference counts) and the CPU time each side spent per
request (the server's from /proc, the client's from its rusage).

Then, batched and shared, k6 open loop (loadtest/http.js, SCENARIO=steady) at
--rate and twice it, with `max_queue_rows` and `server.max_inflight` as shipped, and
reports the answered requests' p50 / p99, what was shed (429) and k6's own CPU per
request.

Prints Markdown tables and writes target/bench/batching.json.
"""
import argparse
import csv
import json
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PERF_ANALYZER = ROOT.parent / "shared/tools/perf_analyzer"
K6 = ROOT / ".venv/bin/k6"
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_common import children_cpu, cpu_seconds, metric_sum  # noqa: E402
from server import Server, binary_path  # noqa: E402

SERVER = binary_path()  # $TICKSERVE_BIN, else target/release/tickserve


def requests_served(http):
    return metric_sum(http, "tickserve_requests_total", 'model="alpha_mlp"')




def sample_server(work, name, model_defaults, cpus):
    """The release server on the sample repository with `model_defaults`, optionally
    pinned to `cpus`; scripts/bench/server.py starts it, waits for ready and stops it."""
    config = work / f"{name}.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\n'
        f'[runtime]\nonnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"\n'
        f'[repository]\npath = "{ROOT / "config/models"}"\n'
        f'[model_defaults]\n{model_defaults}\n')
    return Server(config=config, log=work / f"{name}.log", taskset_cpus=cpus)


def measured(server, command):
    """Runs `command`; returns (server CPU s, client CPU s, requests served) over it."""
    server_cpu, client_cpu = cpu_seconds(server.pid), children_cpu()
    served = requests_served(server.http_port)
    subprocess.run(command, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return (cpu_seconds(server.pid) - server_cpu, children_cpu() - client_cpu,
            requests_served(server.http_port) - served)


def perf_analyzer(server, concurrency, cpus, interval_ms, out):
    csv_path = out.with_suffix(".csv")
    command = (["taskset", "-c", cpus] if cpus else []) + [
        "bash", "-c",
        f'"$0" -m alpha_mlp -u 127.0.0.1:{server.grpc_port} -i grpc --concurrency-range {concurrency} '
        f'--measurement-interval {interval_ms} -f {csv_path} > {out} 2>&1',
        str(PERF_ANALYZER)]
    server_cpu, client_cpu, served = measured(server, command)
    row = next(csv.DictReader(open(csv_path)))
    text = out.read_text()
    inferences = int(re.search(r"Inference count: (\d+)", text).group(1))
    executions = int(re.search(r"Execution count: (\d+)", text).group(1))
    return {
        "concurrency": concurrency,
        "requests_per_s": float(row["Inferences/Second"]),
        "p50_us": int(row["p50 latency"]),
        "p99_us": int(row["p99 latency"]),
        "runs_per_request": executions / inferences,
        "server_cpu_us_per_request": server_cpu / served * 1e6,
        "client_cpu_us_per_request": client_cpu / served * 1e6,
    }


def k6_open_loop(server, rate, duration, out):
    summary = out.with_suffix(".json")
    command = [str(K6), "run", "-q", "-e", "SCENARIO=steady", "-e", f"RATE={rate}",
               "-e", f"DURATION={duration}", "-e", "PREALLOCATED_VUS=200",
               "-e", f"TICKSERVE_HTTP=http://127.0.0.1:{server.http_port}",
               "--summary-export", str(summary), "loadtest/http.js"]
    server_cpu, client_cpu, served = measured(
        server, ["bash", "-c", '"$@" > "$0" 2>&1 || true', str(out)] + command)
    m = json.load(open(summary))["metrics"]
    answered = m["answered_duration"]
    sent = m["iterations"]["count"]
    return {
        "rate": rate,
        "sent_per_s": m["iterations"]["rate"],
        "dropped_by_k6": m.get("dropped_iterations", {}).get("count", 0),
        "p50_us": answered["med"] * 1000,
        "p99_us": answered["p(99)"] * 1000,
        "shed": m["shed"]["value"],
        "server_cpu_us_per_request": server_cpu / max(sent, 1) * 1e6,
        "client_cpu_us_per_request": client_cpu / max(sent, 1) * 1e6,
        "answered": served,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 s measurement windows")
    parser.add_argument("--server-cpus", default="0", help="the pinned server's cores (taskset list)")
    parser.add_argument("--client-cpus", default="1", help="the pinned perf_analyzer's cores")
    parser.add_argument("--rate", type=int, default=2000,
                        help="the open-loop rate taken as sustainable (the overload run sends twice it)")
    args = parser.parse_args()
    for path in (SERVER, PERF_ANALYZER, K6):
        if not path.exists():
            raise SystemExit(f"{path} is missing (build the release server; run scripts/setup.sh)")
    interval = 2000 if args.quick else 4000
    duration = "5s" if args.quick else "10s"
    out = ROOT / "target/bench/batching"
    out.mkdir(parents=True, exist_ok=True)
    results = {"closed_loop": [], "open_loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for placement, server_cpus, client_cpus in (
                ("shared", None, None), ("pinned", args.server_cpus, args.client_cpus)):
            for name, defaults in (("unbatched", "buckets = [1]"), ("batched", "")):
                with sample_server(work, f"{name}-{placement}", defaults, server_cpus) as server:
                    for c in (1, 8, 32):
                        row = perf_analyzer(server, c, client_cpus, interval,
                                            out / f"pa_{name}_{placement}_{c}.txt")
                        row.update(server=name, placement=placement)
                        results["closed_loop"].append(row)
                        print(row, file=sys.stderr)
        with sample_server(work, "batched-open-loop", "", None) as server:
            for rate in (args.rate, 2 * args.rate):
                row = k6_open_loop(server, rate, duration, out / f"k6_{rate}.txt")
                results["open_loop"].append(row)
                print(row, file=sys.stderr)
    (ROOT / "target/bench/batching.json").write_text(json.dumps(results, indent=2))

    print("| placement | server | concurrency | requests/s | p50 (µs) | p99 (µs) "
          "| runs per request | server CPU (µs/request) | perf_analyzer CPU (µs/request) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results["closed_loop"]:
        print(f"| {r['placement']} | {r['server']} | {r['concurrency']} | {r['requests_per_s']:.0f} "
              f"| {r['p50_us']} | {r['p99_us']} | {r['runs_per_request']:.2f} "
              f"| {r['server_cpu_us_per_request']:.0f} | {r['client_cpu_us_per_request']:.0f} |")
    print()
    print("| arrival rate (/s) | sent (/s) | dropped by k6 | p50 (µs) | p99 (µs) | shed (429) "
          "| server CPU (µs/request) | k6 CPU (µs/request) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results["open_loop"]:
        print(f"| {r['rate']} | {r['sent_per_s']:.0f} | {r['dropped_by_k6']} | {r['p50_us']:.0f} "
              f"| {r['p99_us']:.0f} | {r['shed']:.1%} | {r['server_cpu_us_per_request']:.0f} "
              f"| {r['client_cpu_us_per_request']:.0f} |")


if __name__ == "__main__":
    main()

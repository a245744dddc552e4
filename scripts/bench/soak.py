#!/usr/bin/env python3
"""Soak: an open loop at a stated rate for a stated time over both protocols (k6, the
`steady` scenario of loadtest/, HTTP and gRPC at once, each at half the rate), against a
release build started here; once a minute it reads the server's /metrics and prints a
row: resident memory, the allocator's live bytes, compilations, requests and errors in that minute, and the
server-side latency percentiles of that minute (from tickserve_request_duration_seconds,
interpolated within its buckets). At the end: RSS growth after the first minute
(warm-up), compilations after ready, errors, and whether each is within the bar
(RSS growth under 1 %, compilations flat, no errors).

    cargo build --release -p tickserve-server
    python3 scripts/bench/soak.py                      # 10 minutes at 1000 requests/s
    python3 scripts/bench/soak.py --minutes 2 --rate 500

Client and server share this machine's cores.
"""
import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_common import get  # noqa: E402
from server import ROOT, Server  # noqa: E402

K6 = ROOT / ".venv/bin/k6"


def scrape(http):
    """The metrics this script follows, from the server's /metrics."""
    _, text = get(f"http://127.0.0.1:{http}/metrics")

    def total(name, labels=""):
        pattern = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$"
        return sum(float(m.group(2)) for m in re.finditer(pattern, text, re.M)
                   if labels in (m.group(1) or ""))

    buckets = {}
    for m in re.finditer(r'^tickserve_request_duration_seconds_bucket\{([^}]*)\} (\S+)$', text, re.M):
        le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
        buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
    errors = sum(float(v) for labels, v in re.findall(
        r'^tickserve_requests_total\{([^}]*)\} (\S+)$', text, re.M) if 'code="ok"' not in labels)
    return {
        "rss": total("tickserve_process_resident_memory_bytes"),
        "heap": total("tickserve_heap_allocated_bytes"),
        "compilations": total("tickserve_graph_compilations_total"),
        "requests": total("tickserve_requests_total"),
        "errors": errors,
        "buckets": buckets,
    }


def process(pid):
    """Threads, open file descriptors (listeners, connections, files) and anonymous
    resident memory (MiB, the heap's share of RSS) of the server, from /proc."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
    fds = len(list(pathlib.Path(f"/proc/{pid}/fd").iterdir()))
    rollup = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
    anonymous = int(re.search(r"^Anonymous:\s+(\d+) kB", rollup, re.M).group(1)) / 1024
    return threads, fds, anonymous


def percentile(before, after, q):
    """The q-quantile (µs) of the requests between two scrapes, from histogram buckets."""
    edges = sorted((float("inf") if le == "+Inf" else float(le), le) for le in after)
    counts = [(edge, after[le] - before.get(le, 0.0)) for edge, le in edges]
    total = counts[-1][1] if counts else 0
    if total <= 0:
        return float("nan")
    target, previous_edge, previous_count = q * total, 0.0, 0.0
    for edge, count in counts:
        if count >= target:
            if edge == float("inf"):
                return previous_edge * 1e6
            share = (target - previous_count) / max(count - previous_count, 1e-9)
            return (previous_edge + share * (edge - previous_edge)) * 1e6
        previous_edge, previous_count = edge, count
    return previous_edge * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--rate", type=int, default=1000, help="requests per second, both protocols")
    p.add_argument("--binary", help="the server (default: $TICKSERVE_BIN, else target/release/tickserve)")
    p.add_argument("--protocols", default="http,grpc",
                   help="the front ends to load, sharing the rate (default: http,grpc)")
    p.add_argument("--config", help="the server's tickserve.toml (default: config/tickserve.toml)")
    p.add_argument("--stall", action="append", default=[], metavar="SECOND:MS",
                   help="stop the server (SIGSTOP) at SECOND for MS milliseconds, as a noisy "
                        "neighbour or a page-cache stall would; the open loop piles up meanwhile")
    args = p.parse_args()
    stalls = sorted(tuple(float(x) for x in s.split(":")) for s in args.stall)
    duration = f"{args.minutes * 60 + 5}s"
    with Server(binary=args.binary, **({'config': args.config} if args.config else {})) as server:
        ready = scrape(server.http_port)
        clients = []
        addresses = {"http": f"http://127.0.0.1:{server.http_port}",
                     "grpc": f"127.0.0.1:{server.grpc_port}"}
        protocols = args.protocols.split(",")
        for protocol in protocols:
            address = addresses[protocol]
            clients.append(subprocess.Popen(
                [str(K6), "run", "-q", "--no-summary", "--no-thresholds",
                 "-e", "SCENARIO=steady", "-e", f"RATE={args.rate // len(protocols)}", "-e", f"DURATION={duration}",
                 "-e", f"TICKSERVE_{protocol.upper()}={address}", str(ROOT / f"loadtest/{protocol}.js")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT))
        print(f"soak: {args.rate} requests/s ({' and '.join(protocols)}) for {args.minutes} min; "
              f"server pid {server.pid}", flush=True)
        print("| minute | RSS (MiB) | anonymous (MiB) | heap allocated (MiB) | threads | fds "
              "| compilations | requests | errors | p50 (µs) | p99 (µs) |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        rows, last = [], ready
        started = time.monotonic()
        for minute in range(1, args.minutes + 1):
            while stalls and stalls[0][0] < 60 * minute:
                second, ms = stalls.pop(0)
                time.sleep(max(0.0, started + second - time.monotonic()))
                os.kill(server.pid, signal.SIGSTOP)
                time.sleep(ms / 1000)
                os.kill(server.pid, signal.SIGCONT)
                print(f"(stalled the server {ms:.0f} ms at second {second:.0f})", flush=True)
            time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            now = scrape(server.http_port)
            threads, fds, anonymous = process(server.pid)
            row = (minute, now["rss"] / 2**20, anonymous, now["heap"] / 2**20, threads, fds,
                   now["compilations"], now["requests"] - last["requests"],
                   now["errors"] - last["errors"], percentile(last["buckets"], now["buckets"], 0.5),
                   percentile(last["buckets"], now["buckets"], 0.99))
            rows.append((row, now))
            print("| {} | {:.1f} | {:.1f} | {:.2f} | {} | {} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} |"
                  .format(*row), flush=True)
            last = now
        for client in clients:
            client.wait(timeout=120)
    if len(rows) < 2:
        return 0
    warm = rows[0][1]["rss"]
    end = rows[-1][1]["rss"]
    growth = (end - warm) / warm * 100
    compilations = rows[-1][1]["compilations"] - ready["compilations"]
    errors = rows[-1][1]["errors"] - ready["errors"]
    verdict = growth < 1.0 and compilations == 0 and errors == 0
    print(f"\nRSS after warm-up (minute 1) {warm / 2**20:.1f} MiB, at the end {end / 2**20:.1f} MiB: "
          f"{growth:+.2f} % (bar: under 1 %); compilations after ready: {compilations:.0f} (bar: 0); "
          f"errors: {errors:.0f} (bar: 0) -> {'within the bar' if verdict else 'OUTSIDE the bar'}")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())

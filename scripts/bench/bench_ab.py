#!/usr/bin/env python3
"""Old binary against new, in one run: perf_analyzer over gRPC and HTTP (--protocols) on
alpha_mlp (one row per request) at concurrency 1 and 8, the server pinned to one core and perf_analyzer to
another (as scripts/bench/bench_batching.py pins them), the two binaries taking turns round
by round so that the machine's drift falls on both alike. Prints each round and a
Markdown table of medians with the new/old ratios.

    # the old binary, from a commit, in a worktree of its own:
    git worktree add /tmp/tickserve-old-tree COMMIT
    (cd /tmp/tickserve-old-tree && cargo build --release -p tickserve-server)
    cargo build --release -p tickserve-server
    python3 scripts/bench/bench_ab.py --old /tmp/tickserve-old-tree/target/release/tickserve \\
        --new target/release/tickserve            # 3 rounds of 4 s windows: about 3 minutes

Both servers run config/tickserve.toml from this checkout (the sample repository), or
each its own configuration: one binary, a setting off against on (the journal, say):

    python3 scripts/bench/bench_ab.py --old target/release/tickserve --new target/release/tickserve \
        --new-config /tmp/journal-on.toml --protocols grpc --rounds 5
"""
import argparse
import csv
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server import DEFAULT_CONFIG, ROOT, Server  # noqa: E402

PERF_ANALYZER = ROOT.parent / "shared/tools/perf_analyzer"


def measure(port, concurrency, cpus, interval_ms, attempts=3, host="127.0.0.1", extra=(),
            protocol="grpc"):
    """One perf_analyzer measurement over `protocol` (grpc or http) to `port`:
    (requests/s, p50 µs, p99 µs). perf_analyzer gives up when no three windows in twenty
    agree within 20 % (a noisy moment on a shared machine); that measurement is tried
    again, up to `attempts` times. `extra`: more perf_analyzer flags (TLS's, say)."""
    for attempt in range(1, attempts + 1):
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "pa.csv"
            command = ["taskset", "-c", cpus, str(PERF_ANALYZER), "-m", "alpha_mlp",
                       "-u", f"{host}:{port}", "-i", protocol, *extra,
                       "--concurrency-range", str(concurrency),
                       "--measurement-interval", str(interval_ms),
                       "--stability-percentage", "20", "--max-trials", "20", "-f", str(out)]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode == 0:
                row = next(csv.DictReader(open(out)))
                return (float(row["Inferences/Second"]), float(row["p50 latency"]),
                        float(row["p99 latency"]))
            print(f"perf_analyzer found no stable measurement (attempt {attempt} of {attempts})",
                  file=sys.stderr, flush=True)
    raise RuntimeError(f"perf_analyzer failed:\n{run.stdout}\n{run.stderr}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the old server binary")
    p.add_argument("--new", required=True, help="the new server binary")
    p.add_argument("--old-config", default=None, help="the old server's configuration")
    p.add_argument("--new-config", default=None, help="the new server's configuration")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=4000, help="measurement window, ms")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--protocols", default="grpc,http")
    args = p.parse_args()
    if not PERF_ANALYZER.exists():
        sys.exit(f"perf_analyzer wrapper not found at {PERF_ANALYZER}")
    levels = [(protocol, int(c)) for protocol in args.protocols.split(",")
              for c in args.concurrency.split(",")]
    results = {(which, c): [] for which in ("old", "new") for c in levels}
    for round_ in range(1, args.rounds + 1):
        # Alternate which goes first, so neither always runs on a warmer machine.
        order = ("old", "new") if round_ % 2 else ("new", "old")
        for which in order:
            binary = getattr(args, which)
            config = getattr(args, f"{which}_config") or DEFAULT_CONFIG
            with Server(config=config, binary=binary, taskset_cpus=args.server_cpus) as server:
                for protocol, c in levels:
                    port = server.grpc_port if protocol == "grpc" else server.http_port
                    r = measure(port, c, args.client_cpus, args.interval, protocol=protocol)
                    results[(which, (protocol, c))].append(r)
                    print(f"round {round_} {which} {protocol} c{c}: {r[0]:.0f} req/s, "
                          f"p50 {r[1]:.0f} µs, p99 {r[2]:.0f} µs", flush=True)
    print()
    print(f"medians of {args.rounds} rounds, {args.interval} ms windows, server on cpus "
          f"{args.server_cpus}, perf_analyzer on cpus {args.client_cpus}")
    print()
    print("| protocol | concurrency | binary | requests/s | p50 (µs) | p99 (µs) |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for c in levels:
        med = {w: [statistics.median(x[i] for x in results[(w, c)]) for i in range(3)]
               for w in ("old", "new")}
        for w in ("old", "new"):
            rps, p50, p99 = med[w]
            print(f"| {c[0]} | {c[1]} | {w} | {rps:.0f} | {p50:.0f} | {p99:.0f} |")
        ratio = [n / o if o else float("nan") for n, o in zip(med["new"], med["old"])]
        print(f"| {c[0]} | {c[1]} | new/old | {ratio[0]:.2f} | {ratio[1]:.2f} | {ratio[2]:.2f} |")


if __name__ == "__main__":
    main()

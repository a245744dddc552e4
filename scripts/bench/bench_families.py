#!/usr/bin/env python3
"""Model families at scale: N members of one architecture, sharing on and off.

    .venv/bin/python scripts/bench/bench_families.py              # N = 500, about 4 minutes
    .venv/bin/python scripts/bench/bench_families.py --members 50 --duration 10s

Writes N models of the tick architecture (float32 [batch, 16] -> Gemm 16x32 ->
Relu -> Gemm 32x1, each with its own random weights) into a temporary
repository, then for sharing on and off starts the release server on it
(target/release/tickserve, or $TICKSERVE_BIN; build it first:
cargo build --release -p tickserve-server) through scripts/bench/server.py and reports:

  - ready: seconds from starting the process to /v2/health/ready answering 200
  - RSS after load (VmRSS of the process, once ready)
  - compilations (tickserve_graph_compilations_total)
  - single-row latency p50 / p99 under k6 (loadtest/http.js, SCENARIO=family:
    constant arrival RATE per second spread at random over all N members)
  - with sharing on: loading new members at run time over the repository API
    (POST /v2/repository/models/{m}/load, timed by the client, 20 new members),
    and the compilations counter before and after.

Prints a Markdown table and writes target/bench/families.json. Client and
server share this machine's cores.
"""
import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "dev"))
import make_models  # noqa: E402  (the sample models' own generator)
from bench_common import metric_sum  # noqa: E402
from server import Server, binary_path  # noqa: E402


def write_member(root, index):
    model = make_models.mlp(np.random.default_rng(10_000 + index), "tick_mlp", 16, 32, 1)
    make_models.save(model, root, f"tick_{index:03d}")


def compilations(http):
    return metric_sum(http, "tickserve_graph_compilations_total")


def rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(share, repo, members, args, work):
    name = "shared" if share else "unshared"
    config = work / f"tickserve-{name}.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\n'
        f'[runtime]\nonnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"\n'
        f'[repository]\npath = "{repo}"\n'
        f'[model_defaults]\nshare_weights = {"true" if share else "false"}\n'
        f'[security]\nmodel_control_mode = "explicit"\n')  # members are loaded at run time
    with Server(config=config, log=work / f"server-{name}.log", env={"RUST_LOG": "info"},
                stop_timeout=60) as server:
        http = server.http_port
        result = {"sharing": share, "members": members, "ready_s": round(server.ready_s, 2),
                  "rss_mib": round(rss_mib(server.pid), 1), "compilations": compilations(http)}
        summary = work / f"k6-{name}.json"
        subprocess.run([str(ROOT / ".venv/bin/k6"), "run", "-q", "-e", "SCENARIO=family",
                        "-e", f"FAMILY_SIZE={members}", "-e", f"RATE={args.rate}",
                        "-e", f"DURATION={args.duration}", "-e", f"TICKSERVE_HTTP=http://127.0.0.1:{http}",
                        "--summary-export", str(summary), str(ROOT / "loadtest/http.js")],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = json.loads(summary.read_text())["metrics"]
        latency = metrics["answered_duration"]
        result.update(p50_ms=round(latency["med"], 3), p99_ms=round(latency["p(99)"], 3),
                      errors=metrics["errors"]["value"] if "value" in metrics["errors"] else metrics["errors"].get("rate"),
                      rss_after_traffic_mib=round(rss_mib(server.pid), 1))
        if share:
            before = compilations(http)
            times = []
            for index in range(members, members + args.new_members):
                write_member(repo, index)
                t = time.monotonic()
                req = urllib.request.Request(
                    f"http://127.0.0.1:{http}/v2/repository/models/tick_{index:03d}/load", data=b"", method="POST")
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert r.status == 200
                times.append((time.monotonic() - t) * 1000)
            result.update(new_member_load_ms_median=round(statistics.median(times), 2),
                          new_member_load_ms_max=round(max(times), 2),
                          compilations_before_new_members=before,
                          compilations_after_new_members=compilations(http))
            for index in range(members, members + args.new_members):
                shutil.rmtree(repo / f"tick_{index:03d}")
        return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", type=int, default=500)
    p.add_argument("--rate", type=int, default=500, help="requests per second under k6")
    p.add_argument("--duration", default="20s", help="k6 run length per configuration")
    p.add_argument("--new-members", type=int, default=20)
    args = p.parse_args()
    if not binary_path().exists():
        sys.exit(f"{binary_path()} is missing: build the server first "
                 "(cargo build --release -p tickserve-server), or set TICKSERVE_BIN")
    out = ROOT / "target/bench"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tickserve-families-") as tmp:
        work = pathlib.Path(tmp)
        repo = work / "models"
        t = time.monotonic()
        for index in range(args.members):
            write_member(repo, index)
        print(f"wrote {args.members} members in {time.monotonic() - t:.1f} s", file=sys.stderr)
        results = [run(True, repo, args.members, args, work), run(False, repo, args.members, args, work)]
        for name in ("server-shared.log", "server-unshared.log"):
            shutil.copy(work / name, out / f"families-{name}")
    (out / "families.json").write_text(json.dumps(results, indent=2) + "\n")
    on, off = results
    print(f"\n{args.members} members, k6 family scenario at {args.rate}/s for {args.duration}\n")
    print("| sharing | ready (s) | RSS after load (MiB) | compilations | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {'on' if r['sharing'] else 'off'} | {r['ready_s']} | {r['rss_mib']} | {r['compilations']:.0f} "
              f"| {r['p50_ms']} | {r['p99_ms']} |")
    print(f"\nready {off['ready_s'] / on['ready_s']:.1f}x sooner, RSS {off['rss_mib'] / on['rss_mib']:.1f}x smaller, "
          f"p50 {100 * (on['p50_ms'] / off['p50_ms'] - 1):+.1f}% with sharing")
    print(f"new member at run time: median {on['new_member_load_ms_median']} ms, max "
          f"{on['new_member_load_ms_max']} ms over {args.new_members}; compilations "
          f"{on['compilations_before_new_members']:.0f} -> {on['compilations_after_new_members']:.0f}")


if __name__ == "__main__":
    main()

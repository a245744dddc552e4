#!/usr/bin/env python3
"""Models changing under load: k6 open loop on one family member over HTTP and gRPC
while new versions and new models arrive through the repository poll.

    cargo build --release -p tickserve-server
    .venv/bin/python scripts/bench/bench_updates.py [--rate 1000] [--baseline 60] [--updates 120]
        [--every 10] [--config FILE] [--out DIR]

A scratch repository holds `desk` (version 1: tick_000's file; the load's model) and
`tick_001` (the same family). The server runs with `--model-control-mode poll
--repository-poll-secs 1` on the given configuration (default config/tickserve.toml).
k6 (loadtest/updates.js) sends RATE one-row requests per second to `desk`, half over
HTTP and half over gRPC, for BASELINE + UPDATES seconds. After BASELINE seconds, every
EVERY seconds the script adds, alternately:

  - a new version of `desk` (the next tick_NNN file: a new member of the live family),
    written as `desk/.N/` and renamed to `desk/N/`;
  - a new model `fresh_K` of a new family (`--fresh lstm`, the default: an LSTM over 30
    ticks with another hidden width; `--fresh mlp`: a small MLP), written as
    `.fresh_K/` and renamed.

`--compile-priority idle` runs the server with `runtime.compile_priority = "idle"`.

Reported: failed requests (k6's `failed`), answers from a version that was not serving
(a version before it was deployed, or one replaced more than 1 s before the request),
graph compilations (only the new families may compile), and p50 / p99 of the answered
requests in the baseline, in the 10 s after each new member, and in the 10 s after each
new family, with the p99 of each second after a new family's arrival (how long its
compilation disturbs the load). Prints Markdown.
"""
import argparse
import csv
import importlib.util
import json
import os
import re
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_common import metric_sum  # noqa: E402
from server import DEFAULT_CONFIG, Server  # noqa: E402

K6 = ROOT / ".venv/bin/k6"
SOURCE = ROOT / "config/models"


def make_models():
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "scripts/dev/make_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def deploy_version(repo, version):
    """desk/N from tick_NNN's file, written hidden then renamed."""
    source = SOURCE / f"tick_{version % 8:03d}" / "1" / "model.onnx"
    hidden = repo / "desk" / f".{version}"
    hidden.mkdir(parents=True)
    shutil.copy(source, hidden / "model.onnx")
    hidden.rename(repo / "desk" / str(version))


def deploy_family(repo, mm, k, kind):
    """fresh_K, a graph no family has: an LSTM over 30 ticks of 8 features with 32 + 8K
    hidden units (`lstm`), or an MLP of 16 inputs and 40 + K hidden (`mlp`)."""
    hidden = repo / f".fresh_{k}"
    rng = np.random.default_rng(1000 + k)
    graph = (mm.lstm(rng, f"fresh_{k}", 30, 8, 32 + 8 * k) if kind == "lstm"
             else mm.mlp(rng, f"fresh_{k}", 16, 40 + k, 1))
    mm.save(graph, hidden.parent, hidden.name)
    hidden.rename(repo / f"fresh_{k}")


def served_versions(http):
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/desk", timeout=5) as r:
        return [int(v) for v in json.load(r)["versions"]]


def percentile(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--baseline", type=int, default=60, help="seconds of load before updates")
    p.add_argument("--updates", type=int, default=120, help="seconds of load with updates")
    p.add_argument("--every", type=int, default=10, help="seconds between two updates")
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--fresh", choices=["lstm", "mlp"], default="lstm",
                   help="the new families' graph (default lstm)")
    p.add_argument("--compile-priority", choices=["normal", "idle"], default=None,
                   help="set runtime.compile_priority in a copy of the configuration")
    p.add_argument("--out", type=pathlib.Path, default=None, help="keep k6's CSV and logs here")
    args = p.parse_args()
    mm = make_models()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tickserve-updates-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    repo = work / "models"
    (repo / "desk").mkdir(parents=True)
    shutil.copytree(SOURCE / "tick_000" / "1", repo / "desk" / "1")
    shutil.copytree(SOURCE / "tick_001", repo / "tick_001")
    config = pathlib.Path(args.config).resolve()
    if args.compile_priority:
        text = config.read_text()
        if "[runtime]" not in text:
            text += "\n[runtime]\n"
        text = text.replace("[runtime]", f'[runtime]\ncompile_priority = "{args.compile_priority}"', 1)
        config = work / "tickserve.toml"
        config.write_text(text)
    events = []  # (deployed at, switched at, kind, name)
    total = args.baseline + args.updates
    server = Server(config=config, log=out / "server.log",
                    args=["--model-repository", repo, "--model-control-mode", "poll",
                          "--repository-poll-secs", "1"])
    with server:
        http, grpc = server.http_port, server.grpc_port
        compiled_at_start = metric_sum(http, "tickserve_graph_compilations_total")
        csv_path = out / "requests.csv"
        k6 = subprocess.Popen(
            [str(K6), "run", "-q", "-e", f"RATE={args.rate}", "-e", f"DURATION={total}s",
             "-e", f"TICKSERVE_HTTP=http://127.0.0.1:{http}", "-e", f"TICKSERVE_GRPC=127.0.0.1:{grpc}",
             "--summary-export", str(out / "summary.json"), "--out", f"csv={csv_path}",
             "loadtest/updates.js"],
            cwd=ROOT, env={**os.environ, "K6_CSV_TIME_FORMAT": "unix_milli"},
            stdout=open(out / "k6.log", "w"), stderr=subprocess.STDOUT)
        started = time.time()
        time.sleep(args.baseline)
        version, family = 1, 0
        for n in range(args.updates // args.every):
            at = time.time()
            if n % 2 == 0:
                version += 1
                deploy_version(repo, version)
                while version not in served_versions(http) and time.time() - at < 30:
                    time.sleep(0.01)
                events.append((at, time.time(), "member", f"desk/{version}"))
            else:
                family += 1
                deploy_family(repo, mm, family, args.fresh)
                name = f"fresh_{family}"
                while time.time() - at < 60:
                    try:
                        with urllib.request.urlopen(
                                f"http://127.0.0.1:{http}/v2/models/{name}/ready", timeout=5) as r:
                            if r.status == 200:
                                break
                    except OSError:
                        pass
                    time.sleep(0.01)
                events.append((at, time.time(), "family", name))
            time.sleep(max(0.0, at + args.every - time.time()))
        k6.wait()
        compiled = metric_sum(http, "tickserve_graph_compilations_total") - compiled_at_start
        compiled_desk = metric_sum(http, "tickserve_graph_compilations_total",
                                   f'family="{family_of(http, "desk")}"')
    durations, versions, failures = [], [], []
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            t = int(row["timestamp"]) / 1000
            name = row["metric_name"]
            if name in ("http_req_duration", "grpc_req_duration"):
                durations.append((t, float(row["metric_value"]) * 1000, row["scenario"]))
            elif name == "answered_version":
                versions.append((t, int(float(row["metric_value"]))))
            elif name == "failed":
                failures.append((t, row.get("extra_tags", "")))
    took = {}
    for line in open(out / "server.log"):
        m = re.search(r'model switched model=(\S+) versions=\[(\d+)\] took=(\S+)', line)
        if m:
            name = m.group(1) if m.group(1) != "desk" else f"desk/{m.group(2)}"
            took[name] = m.group(3)
    report(args, started, events, durations, versions, failures, compiled, compiled_desk, family,
           took)


def family_of(http, model):
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}", timeout=5) as r:
        return json.load(r)["parameters"]["family"]


def report(args, started, events, durations, versions, failures, compiled, compiled_desk, families,
           took):
    base = [d for t, d, _ in durations if started + 5 <= t < started + args.baseline]
    member_windows = [(a, a + args.every) for a, _, kind, _ in events if kind == "member"]
    family_windows = [(a, a + args.every) for a, _, kind, _ in events if kind == "family"]

    def within(windows):
        return [d for t, d, _ in durations if any(a <= t < b for a, b in windows)]
    members, fams = within(member_windows), within(family_windows)
    # A version answered before it was deployed, or after its successor switched in
    # (more than 1 s before the request was sent).
    deployed = {1: 0.0}
    switched = {1: 0.0}
    for at, done, kind, name in events:
        if kind == "member":
            v = int(name.split("/")[1])
            deployed[v], switched[v] = at, done
    stale = 0
    for t, v in versions:
        successor = switched.get(v + 1)
        if v not in deployed or t < deployed[v] or (successor and t > successor + 1.0):
            stale += 1
    extra = f" --compile-priority {args.compile_priority}" if args.compile_priority else ""
    print(f"`.venv/bin/python scripts/bench/bench_updates.py --rate {args.rate} --baseline "
          f"{args.baseline} --updates {args.updates} --every {args.every} --fresh {args.fresh}"
          f"{extra}`\n")
    print(f"- requests answered: {len(versions)}; failed: {len(failures)}; "
          f"answers from a version not serving: {stale}")
    print(f"- graph compilations during the run: {compiled:.0f} (new families: {families}; "
          f"the load's family: {compiled_desk:.0f} in all, at its start)")
    print("\n| window | requests | p50 (µs) | p99 (µs) | p99 / baseline |")
    print("| --- | ---: | ---: | ---: | ---: |")
    b99 = percentile(base, 99)
    for label, values in [("baseline (no updates)", base), ("10 s after a new member", members),
                          ("10 s after a new family", fams)]:
        print(f"| {label} | {len(values)} | {percentile(values, 50):.0f} | "
              f"{percentile(values, 99):.0f} | {percentile(values, 99) / b99:.2f} |")
    print("\n| update | load and switch took | seen serving after (s) | p99 in each second after "
          "it (µs) |")
    print("| --- | ---: | ---: | --- |")
    for at, done, kind, name in events:
        seconds = []
        for s in range(args.every):
            window = [d for t, d, _ in durations if at + s <= t < at + s + 1]
            seconds.append(f"{percentile(window, 99):.0f}")
        print(f"| {kind} {name} | {took.get(name, '?')} | {done - at:.2f} | {' '.join(seconds)} |")
    if failures:
        print("\nfailures:", failures[:10])


if __name__ == "__main__":
    main()

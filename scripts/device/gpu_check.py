#!/usr/bin/env python3
"""The server phases of the GPU check (scripts/gpu_check.sh runs each under its own timeout).

    python3 scripts/device/gpu_check.py e2e       --binary B --work DIR --pa PERF_ANALYZER
    python3 scripts/device/gpu_check.py families  --binary B --work DIR --pa PERF_ANALYZER [--members 128]
    python3 scripts/device/gpu_check.py sequences --binary B --work DIR [--device gpu:0]
    python3 scripts/device/gpu_check.py lstm

e2e: a server with `devices = ["gpu:0"]` and one with `["cpu"]` on loopback. Every model
the GPU server runs on the GPU answers what the CPU server answers within 1e-5 relative
at 1, 2, ..., 64 rows and at the padding and splitting counts 3, 5, 13, 33, 65; then
perf_analyzer gRPC and HTTP at concurrency 1 and 16 on `alpha_mlp`, GPU then CPU, p50 and
p99; compilations before and after (they must not move) and the device compute histogram.

families: N members of one architecture (`share_weights`) on `["gpu:0"]` beside the same
on `["cpu"]`: every member answers what the CPU answers; 16 perf_analyzer clients at once,
each on its own member (their rows share runs: each row with its own member's weights),
against one member at concurrency 16; weight swaps and runs of mixed members, compilations
before and after, the device memory gauges.

sequences: seq_lstm_step (a stateful LSTM tick) on a GPU server beside a CPU server: 64
sequences x 100 ticks, each tick's 64 requests sent at once (so a GPU batch holds rows of
different sequences), every answer within 1e-5 relative of the CPU's; per-tick latency over
HTTP of one sequence alone and of 64 at once, GPU then CPU, p50 and p99; device memory
before and after 10,000 sequences are started; compilations before and after.

lstm: decision data for recurrent models on the GPU: PyTorch replaying a CUDA graph of one
LSTM step (8 -> 64, and 2 layers of 128) at batch 1 ... 64, beside ONNX Runtime on the
CPU running the same step (an ONNX LSTM node per layer).

Needs Python 3 with numpy (and onnx for families, torch and onnxruntime for lstm). Lines
starting with "SUMMARY " are the figures gpu_check.sh collects into summary.md.
"""
import argparse
import csv
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "dev"))  # make_models (the families phase)
from bench_common import metric_sum  # noqa: E402
from server import Server  # noqa: E402

ROW_COUNTS = [1, 2, 4, 8, 16, 32, 64, 3, 5, 13, 33, 65]
TOLERANCE = 1e-5


def say(line):
    print(line, flush=True)


def summary(line):
    say(f"SUMMARY {line}")


def http_json(port, path, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def config(work, name, devices, repository, extra="", gpu_mode="graphs"):
    path = work / f"{name}.toml"
    path.write_text(
        f'[server]\nhost = "127.0.0.1"\n'
        f'[runtime]\nonnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"\n'
        f'gpu_mode = "{gpu_mode}"\n'
        f'[repository]\npath = "{repository}"\n'
        f'[model_defaults]\ndevices = {json.dumps(devices)}\n{extra}')
    return path


def on_gpu(port, model):
    """Whether the server runs `model`'s first replica on a GPU (its model configuration)."""
    groups = http_json(port, f"/v2/models/{model}/config").get("instance_group", [])
    return any(g.get("kind") == "KIND_GPU" for g in groups)


def stateless(port, model):
    """Whether `model` answers a request alone (no sequence state, no windows)."""
    view = http_json(port, f"/v2/models/{model}/config")
    return not view.get("sequence_batching") and "sequence_windows" not in view.get("parameters", {})


def inputs_of(port, model):
    meta = http_json(port, f"/v2/models/{model}")
    return [(i["name"], [int(d) for d in i["shape"][1:]], i["datatype"]) for i in meta["inputs"]]


def infer(port, model, inputs, rows, rng):
    body = {"inputs": []}
    for name, dims, datatype in inputs:
        width = math.prod(dims) if dims else 1
        body["inputs"].append({"name": name, "shape": [rows, *dims], "datatype": datatype,
                               "data": [float(x) for x in rng.uniform(-2, 2, rows * width).astype("float32")]})
    return body


def compare(gpu_port, cpu_port, model, body):
    got = http_json(gpu_port, f"/v2/models/{model}/infer", body)
    want = http_json(cpu_port, f"/v2/models/{model}/infer", body)
    worst = 0.0
    for g, c in zip(sorted(got["outputs"], key=lambda o: o["name"]),
                    sorted(want["outputs"], key=lambda o: o["name"])):
        if g["shape"] != c["shape"] or len(g["data"]) != len(c["data"]):
            return math.inf
        for a, b in zip(g["data"], c["data"]):
            worst = max(worst, abs(a - b) / max(abs(b), 1.0))
    return worst


def correctness(gpu, cpu, rng, device):
    models = [m["name"] for m in http_json(gpu.http_port, "/v2/repository/index", {})
              if m.get("state") == "READY"]
    # A dry run (no GPU) compares every model, CPU with CPU: the check's own check.
    # Stateful and windowed models are compared tick by tick in the sequences phase.
    gpu_models = [m for m in models if stateless(gpu.http_port, m)
                  and (device == "cpu" or on_gpu(gpu.http_port, m))]
    say(f"models ready: {', '.join(models)}; compared: {', '.join(gpu_models) or 'none'}")
    failures = []
    worst = 0.0
    for model in gpu_models:
        inputs = inputs_of(gpu.http_port, model)
        for rows in ROW_COUNTS:
            try:
                err = compare(gpu.http_port, cpu.http_port, model, infer(gpu.http_port, model, inputs, rows, rng))
            except Exception as e:  # noqa: BLE001  (a failed request is a finding, not a stop)
                failures.append(f"{model} at {rows} rows: {e}")
                continue
            worst = max(worst, err)
            if err > TOLERANCE:
                failures.append(f"{model} at {rows} rows: relative error {err:.3g}")
    ok = gpu_models and not failures
    summary(f"| correctness, server {device} vs cpu | {len(gpu_models)} models x {len(ROW_COUNTS)} row counts "
            f"| max relative error {worst:.3g} | {'PASS' if ok else 'FAIL'} |")
    for failure in failures[:20]:
        say(f"  {failure}")
    return ok


def perf(pa, model, port, protocol, concurrency, work, extra=()):
    """perf_analyzer on `model`: (p50 µs, p99 µs, throughput/s), or None."""
    if not pa:
        say(f"  perf_analyzer {model} {protocol} c{concurrency}: skipped, no perf_analyzer runs here")
        return None
    out = work / f"pa-{model}-{protocol}-{concurrency}-{port}.csv"
    args = [*pa, "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol,
            "--concurrency-range", str(concurrency), "--measurement-interval", "2000",
            "--max-trials", "4", "--stability-percentage", "25", "-f", str(out), *extra]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 or not out.exists():
        say(f"  perf_analyzer {' '.join(args[len(pa):])} failed: {done.stdout[-600:]}{done.stderr[-600:]}")
        return None
    row = next(csv.DictReader(out.open()))
    return int(row["p50 latency"]), int(row["p99 latency"]), float(row["Inferences/Second"])


def e2e(args):
    import numpy as np
    work = pathlib.Path(args.work)
    rng = np.random.default_rng(1)
    repo = ROOT / "config/models"
    gpu_cfg = config(work, f"gpu-{args.gpu_mode}", [args.device], repo, gpu_mode=args.gpu_mode)
    cpu_cfg = config(work, "cpu", ["cpu"], repo)
    under_test = args.device if args.gpu_mode == "graphs" else f"{args.device} ({args.gpu_mode})"
    with Server(config=gpu_cfg, binary=args.binary, log=work / "server-gpu.log", ready_timeout=120) as gpu, \
            Server(config=cpu_cfg, binary=args.binary, log=work / "server-cpu.log", ready_timeout=120) as cpu:
        say(f"{args.device} server ready in {gpu.ready_s:.1f} s, CPU server in {cpu.ready_s:.1f} s")
        compiled = metric_sum(gpu.http_port, "tickserve_graph_compilations_total")
        correctness(gpu, cpu, rng, args.device)
        pa = args.pa.split()
        for server, device in ((gpu, under_test), (cpu, "cpu")):
            for protocol, port in (("grpc", server.grpc_port), ("http", server.http_port)):
                for concurrency in (1, 16):
                    got = perf(pa, "alpha_mlp", port, protocol, concurrency, work)
                    if got:
                        p50, p99, rate = got
                        summary(f"| alpha_mlp {protocol} c{concurrency} on {device} | p50 {p50} µs "
                                f"| p99 {p99} µs | {rate:.0f}/s |")
        after = metric_sum(gpu.http_port, "tickserve_graph_compilations_total")
        summary(f"| compilations after ready ({args.device} server, every phase above) | {compiled:.0f} at ready "
                f"| {after:.0f} after | {'PASS' if after == compiled else 'FAIL'} |")
        count = metric_sum(gpu.http_port, "tickserve_device_compute_duration_seconds_count")
        total = metric_sum(gpu.http_port, "tickserve_device_compute_duration_seconds_sum")
        if count:
            summary(f"| device compute per bucket run (server histogram) | {count:.0f} runs "
                    f"| mean {total / count * 1e6:.1f} µs | |")
        for name in ("tickserve_device_memory_bytes", "tickserve_device_memory_used_bytes"):
            say(f"{name}: {metric_sum(gpu.http_port, name) / 2**20:.1f} MiB")


class MemorySampler:
    """Device memory in use (nvidia-smi, MiB) every 0.5 s from now until `stop`."""

    def __init__(self):
        import threading
        self.samples = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(0.5):
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", "0"], capture_output=True, text=True, timeout=10, check=False)
            if out.returncode == 0 and out.stdout.strip():
                self.samples.append(int(out.stdout.split()[0]))

    def stop(self):
        self.done.set()
        self.thread.join(timeout=15)
        return (min(self.samples, default=0), max(self.samples, default=0), len(self.samples))


def families(args):
    import numpy as np
    import make_models
    work = pathlib.Path(args.work)
    repo = work / "family"
    for index in range(args.members):
        model = make_models.mlp(np.random.default_rng(10_000 + index), "tick_mlp", 16, 32, 1)
        make_models.save(model, repo, f"tick_{index:03d}")
    extra = "share_weights = true\n"
    gpu_cfg = config(work, "family-gpu", [args.device], repo, extra)
    cpu_cfg = config(work, "family-cpu", ["cpu"], repo, extra)
    rng = np.random.default_rng(2)
    with Server(config=gpu_cfg, binary=args.binary, log=work / "family-gpu.log", ready_timeout=240) as gpu, \
            Server(config=cpu_cfg, binary=args.binary, log=work / "family-cpu.log", ready_timeout=240) as cpu:
        say(f"{args.members} members ready: GPU server in {gpu.ready_s:.1f} s, CPU in {cpu.ready_s:.1f} s")
        compiled = metric_sum(gpu.http_port, "tickserve_graph_compilations_total")
        names = [f"tick_{i:03d}" for i in range(args.members)]
        placed = sum(on_gpu(gpu.http_port, n) for n in names)
        sampler = MemorySampler() if args.device != "cpu" else None
        inputs = inputs_of(gpu.http_port, names[0])
        worst, failures = 0.0, []
        for name in names:
            err = compare(gpu.http_port, cpu.http_port, name, infer(gpu.http_port, name, inputs, 5, rng))
            worst = max(worst, err)
            if err > TOLERANCE:
                failures.append(name)
        summary(f"| family members, {args.device} vs cpu | {placed}/{args.members} on a GPU "
                f"| max relative error {worst:.3g} | {'PASS' if not failures else 'FAIL'} |")
        pa = args.pa.split()
        swaps = metric_sum(gpu.http_port, "tickserve_weight_swaps_total")
        mixed = metric_sum(gpu.http_port, "tickserve_mixed_member_runs_total")
        alone = perf(pa, names[0], gpu.grpc_port, "grpc", 16, work)
        clients = []
        for index, name in enumerate(names[:16] if pa else []):
            out = work / f"pa-member-{index}.csv"
            clients.append((out, subprocess.Popen(
                [*pa, "-m", name, "-u", f"127.0.0.1:{gpu.grpc_port}", "-i", "grpc",
                 "--concurrency-range", "1", "--measurement-interval", "3000", "--max-trials", "3",
                 "--stability-percentage", "50", "-f", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        p99s, rates = [], []
        for out, process in clients:
            process.wait(timeout=90)
            if out.exists():
                row = next(csv.DictReader(out.open()))
                p99s.append(int(row["p99 latency"]))
                rates.append(float(row["Inferences/Second"]))
        swapped = metric_sum(gpu.http_port, "tickserve_weight_swaps_total") - swaps
        mixed = metric_sum(gpu.http_port, "tickserve_mixed_member_runs_total") - mixed
        if alone and p99s:
            worst_p99 = max(p99s)
            summary(f"| 16 clients on 16 members vs one member at c16 (gRPC) | p99 {worst_p99} µs worst of "
                    f"{len(p99s)}, {sum(rates):.0f}/s together | one member p99 {alone[1]} µs, {alone[2]:.0f}/s "
                    f"| {'PASS' if worst_p99 <= 2 * alone[1] else 'FAIL'} (x{worst_p99 / alone[1]:.2f}) |")
        summary(f"| weight swaps, runs of mixed members under load | {swapped:.0f} swaps | {mixed:.0f} mixed runs "
                f"| {'PASS' if swapped + mixed > 0 else 'FAIL'} |")
        if sampler:
            low, high, samples = sampler.stop()
            if samples:
                drift = (high - low) / high if high else 0.0
                summary(f"| device memory used after ready (nvidia-smi, every 0.5 s) | {low}-{high} MiB over "
                        f"{samples} samples | within 1 % | {'PASS' if drift <= 0.01 else 'FAIL'} ({drift:.2%}) |")
        after = metric_sum(gpu.http_port, "tickserve_graph_compilations_total")
        summary(f"| family compilations after ready | {compiled:.0f} at ready | {after:.0f} after "
                f"| {'PASS' if after == compiled else 'FAIL'} |")
        for name in ("tickserve_device_memory_bytes", "tickserve_device_memory_used_bytes"):
            say(f"{name}: {metric_sum(gpu.http_port, name) / 2**20:.1f} MiB")


def sequences(args):
    import concurrent.futures
    import shutil

    import numpy as np
    work = pathlib.Path(args.work)
    rng = np.random.default_rng(3)
    # The sample repository, seq_lstm_step allowed 16,384 sequences (10,000 are started).
    repo = work / "models"
    shutil.copytree(ROOT / "config/models", repo, dirs_exist_ok=True)
    toml = repo / "seq_lstm_step/model.toml"
    toml.write_text(toml.read_text().replace("max_sequences = 4096", "max_sequences = 16384"))
    model = "seq_lstm_step"
    gpu_cfg = config(work, f"gpu-{args.gpu_mode}", [args.device], repo, gpu_mode=args.gpu_mode)
    cpu_cfg = config(work, "cpu", ["cpu"], repo)
    under_test = args.device if args.gpu_mode == "graphs" else f"{args.device} ({args.gpu_mode})"

    def tick(port, sequence, start, x):
        body = {"parameters": {"sequence_id": sequence, "sequence_start": start},
                "inputs": [{"name": "tick", "shape": [1, 8], "datatype": "FP32", "data": x}]}
        return http_json(port, f"/v2/models/{model}/infer", body)

    def timed(port, sequence, start, x):
        began = time.perf_counter()
        tick(port, sequence, start, x)
        return time.perf_counter() - began

    gpu_log = work / f"server-gpu-{args.gpu_mode}.log"
    with Server(config=gpu_cfg, binary=args.binary, log=gpu_log, ready_timeout=120) as gpu, \
            Server(config=cpu_cfg, binary=args.binary, log=work / "server-cpu.log", ready_timeout=120) as cpu, \
            concurrent.futures.ThreadPoolExecutor(64) as pool:
        placed = on_gpu(gpu.http_port, model)
        say(f"{model} on the {args.device} server: {'GPU' if placed else 'not on a GPU'}")
        if args.gpu_mode != "graphs":
            lines = gpu_log.read_text(errors="replace").splitlines()
            for line in [x for x in lines if "resident" in x][:20]:
                say(f"  {line}")
        compiled = metric_sum(gpu.http_port, "tickserve_graph_compilations_total")
        worst, failures = 0.0, []
        for t in range(100):
            xs = rng.uniform(-2, 2, (64, 8)).astype("float32").tolist()
            got = list(pool.map(lambda s: tick(gpu.http_port, s + 1, t == 0, xs[s]), range(64)))  # noqa: B023
            want = list(pool.map(lambda s: tick(cpu.http_port, s + 1, t == 0, xs[s]), range(64)))  # noqa: B023
            for s, (g, c) in enumerate(zip(got, want)):
                for go, co in zip(sorted(g["outputs"], key=lambda o: o["name"]),
                                  sorted(c["outputs"], key=lambda o: o["name"])):
                    err = max((abs(a - b) / max(abs(b), 1.0) for a, b in zip(go["data"], co["data"])),
                              default=math.inf)
                    worst = max(worst, err)
                    if err > TOLERANCE:
                        failures.append(f"sequence {s + 1} tick {t} output {go['name']}: {err:.3g}")
        ok = placed and not failures
        summary(f"| {model}, 64 sequences x 100 ticks, server {under_test} vs cpu | per tick, every output "
                f"| max relative error {worst:.3g} | {'PASS' if ok else 'FAIL'} |")
        for failure in failures[:10]:
            say(f"  {failure}")
        x = rng.uniform(-2, 2, 8).astype("float32").tolist()
        for server, device in ((gpu, under_test), (cpu, "cpu")):
            alone = sorted(timed(server.http_port, 100_000, i == 0, x) for i in range(500))
            together = []
            for i in range(50):
                together += pool.map(lambda s: timed(server.http_port, 100_001 + s, i == 0, x), range(64))  # noqa: B023
            together.sort()
            for label, times in (("1 sequence", alone), ("64 sequences at once", together)):
                summary(f"| {model} per tick over HTTP, {label}, on {device} "
                        f"| p50 {times[len(times) // 2] * 1e6:.0f} µs | p99 {times[len(times) * 99 // 100] * 1e6:.0f} µs | |")
        used = "tickserve_device_memory_used_bytes"
        before = metric_sum(gpu.http_port, used)
        started = sum(1 for _ in pool.map(lambda s: tick(gpu.http_port, 200_000 + s, True, x), range(10_000)))
        after = metric_sum(gpu.http_port, used)
        summary(f"| device memory in use, {started} sequences started | {before / 2**20:.1f} MiB before "
                f"| {after / 2**20:.1f} MiB after | {'PASS' if after - before < 2**20 else 'FAIL'} |")
        final = metric_sum(gpu.http_port, "tickserve_graph_compilations_total")
        summary(f"| compilations ({model} phase) | {compiled:.0f} at ready | {final:.0f} after "
                f"| {'PASS' if final == compiled else 'FAIL'} |")


def lstm(_args):
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper
    device = torch.device("cuda")
    say(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; onnxruntime {ort.__version__} on the CPU")
    for label, inputs, hidden, layers in (("8->64", 8, 64, 1), ("8->2x128", 8, 128, 2)):
        cell = torch.nn.LSTM(inputs, hidden, num_layers=layers).to(device).eval()
        # The same weights as an ONNX LSTM node per layer (gates i, o, f, c in ONNX, i, f, g, o in torch).
        nodes, initializers, previous = [], [], "x"
        for layer in range(layers):
            w = getattr(cell, f"weight_ih_l{layer}").detach().cpu().numpy()
            r = getattr(cell, f"weight_hh_l{layer}").detach().cpu().numpy()
            b = (getattr(cell, f"bias_ih_l{layer}").detach().cpu().numpy(),
                 getattr(cell, f"bias_hh_l{layer}").detach().cpu().numpy())
            order = lambda m: np.concatenate([m[0:hidden], m[3 * hidden:], m[hidden:2 * hidden], m[2 * hidden:3 * hidden]])  # noqa: E731
            initializers += [numpy_helper.from_array(order(w)[None], f"W{layer}"),
                             numpy_helper.from_array(order(r)[None], f"R{layer}"),
                             numpy_helper.from_array(np.concatenate([order(b[0]), order(b[1])])[None], f"B{layer}")]
            nodes += [helper.make_node("LSTM", [previous, f"W{layer}", f"R{layer}", f"B{layer}", "", f"h{layer}", f"c{layer}"],
                                       [f"y{layer}", f"ho{layer}", f"co{layer}"], hidden_size=hidden),
                      helper.make_node("Squeeze", [f"y{layer}", "axis1"], [f"s{layer}"])]
            previous = f"s{layer}"
        initializers.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"))
        graph = helper.make_graph(
            nodes, "lstm_step",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "b", inputs])]
            + [helper.make_tensor_value_info(f"{s}{layer}", TensorProto.FLOAT, [1, "b", hidden])
               for layer in range(layers) for s in "hc"],
            [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, "b", hidden])], initializers)
        # IR 10: the ONNX Runtime beside PyTorch may be older than the onnx package.
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for batch in (1, 4, 16, 64):
            x = torch.randn(1, batch, inputs, device=device)
            h = torch.zeros(layers, batch, hidden, device=device)
            c = torch.zeros(layers, batch, hidden, device=device)
            with torch.no_grad():
                for _ in range(3):
                    cell(x, (h, c))
                torch.cuda.synchronize()
                graph_ = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph_):
                    y, _ = cell(x, (h, c))
                times = []
                for _ in range(1000):
                    start = time.perf_counter()
                    graph_.replay()
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
            feed = {"x": x.cpu().numpy()}
            for layer in range(layers):
                feed[f"h{layer}"] = np.zeros((1, batch, hidden), np.float32)
                feed[f"c{layer}"] = np.zeros((1, batch, hidden), np.float32)
            cpu_out = session.run(None, feed)[0]
            err = float(np.max(np.abs(cpu_out - y.cpu().numpy()) / np.maximum(np.abs(cpu_out), 1.0)))
            cpu_times = []
            for _ in range(1000):
                start = time.perf_counter()
                session.run(None, feed)
                cpu_times.append(time.perf_counter() - start)
            times.sort()
            cpu_times.sort()
            summary(f"| LSTM step {label} batch {batch} | CUDA graph replay p50 {times[500] * 1e6:.1f} µs "
                    f"p99 {times[990] * 1e6:.1f} µs | ONNX Runtime CPU p50 {cpu_times[500] * 1e6:.1f} µs "
                    f"p99 {cpu_times[990] * 1e6:.1f} µs | max rel diff {err:.2g} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["e2e", "families", "sequences", "lstm"])
    parser.add_argument("--binary", default=str(ROOT / ".gpu/tickserve"))
    parser.add_argument("--work", default=None)
    parser.add_argument("--pa", default="perf_analyzer", help="the perf_analyzer command (words)")
    parser.add_argument("--members", type=int, default=128)
    parser.add_argument("--device", default="gpu:0", help="the devices of the server under test (cpu: a dry run)")
    parser.add_argument("--gpu-mode", default="graphs", choices=["graphs", "resident", "auto"],
                        help="runtime.gpu_mode of the server under test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        args.work = args.work or tmp
        pathlib.Path(args.work).mkdir(parents=True, exist_ok=True)
        {"e2e": e2e, "families": families, "sequences": sequences, "lstm": lstm}[args.phase](args)


if __name__ == "__main__":
    main()

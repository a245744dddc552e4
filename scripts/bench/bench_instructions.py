#!/usr/bin/env python3
"""The server's cost per request counted in instructions, per front end, with floors.

    cargo build --release -p tickserve-server
    .venv/bin/python scripts/bench/bench_instructions.py [--requests 500] [--warmup 200]
    .venv/bin/python scripts/bench/bench_instructions.py --old OLD_BINARY --new NEW_BINARY
    # what a setting costs: one binary, two configurations
    .venv/bin/python scripts/bench/bench_instructions.py --old B --new B --new-config SETTING.toml

Latency on a shared machine moves 3x from one day to the next; instruction counts do
not. The server runs under `valgrind --tool=callgrind` (collection off until asked,
`callgrind_control -i on`), on the sample repository with the shared-memory front end
on. For each case the client sends WARMUP requests, the counters are zeroed
(`callgrind_control -z`), it sends REQUESTS one-row `alpha_mlp` requests one at a time,
and the counts are dumped (`callgrind_control -d`): the server's instructions per
request, every thread (the metrics-upkeep thread's periodic work is taken out).

Cases: v2 gRPC unary (tritonclient), v2 gRPC stream (one ModelStreamInfer stream),
v2 HTTP JSON and binary (tritonclient), TF Serving REST (`:predict`, JSON) and gRPC
(`Predict`), shared memory (tickserve_client). Floors, in the same run:
  - `grpc ServerLive`: an empty unary RPC on the same port, stack and middleware;
  - `http GET /v2/health/live`: an empty HTTP request on the same port and stack, on
    tritonclient's kept-alive connection as the v2 HTTP cases;
  - `http GET /v2/health/live, a connection each`: the same from urllib, which opens a
    connection per request as the TF Serving REST case does;
  - `grpc stream, unknown model`: the same message on an open ModelStreamInfer stream,
    for a model the server does not have (an error answer on the stream);
  - `shm stale handle`: the shared-memory request's bytes with a handle the server does
    not know: the iceoryx2 round trip of the same bytes and an error answer;
  - the engine: every call into ONNX Runtime in the case itself, inclusive of what
    the library does inside it (its own allocations and copies included).
A front end's overhead is its count less its transport floor and its engine
instructions: what tickserve's own code costs on top of moving the bytes and running
the model.

Where they go: every function's own (exclusive) instructions, grouped by layer, from
its file or symbol name: transport (tokio, hyper, h2, tonic, axum, tower, iceoryx2, the
listener), protocol (prost, serde, our codecs: gRPC and HTTP conversion, TF Serving,
shared memory), edge, runtime (and core: validation, batching, the executor), engine
(ONNX Runtime), metrics, journal, allocation (jemalloc), copies (libc's memcpy and
memmove), kernel/libc (the rest of libc, system-call stubs) and other.

With --old/--new the two binaries run one after the other (each with its own
configuration when --old-config/--new-config say so) and the table shows both counts
and their ratio. Raw callgrind files go to target/bench/instructions/. Takes
about a minute per 1000 requests of each case on a 2-core machine.
"""
import argparse
import json
import os
import pathlib
import queue
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "crates/tickserve-server/tests/python"))
sys.path.insert(0, str(ROOT / "clients/python"))
from server import Server  # noqa: E402

OUT = ROOT / "target/bench/instructions"
FEATURES = 50
# Threads whose work is periodic, not per request: the metrics upkeep (folds histogram
# samples every few seconds) and the shared-memory front end's thread outside the
# shared-memory case (idle, it checks for dead client nodes every 100 ms). In the
# shared-memory case that check is taken out of its thread's count.
UPKEEP = "PrometheusHandle::run_upkeep"
# The thread's loop (`serve`) may be inlined into its supervisor, and both into the
# thread's start; its dead-node check (iceoryx2's) runs on no other thread.
SHM_THREADS = ("tickserve_server::shm::serve", "tickserve_server::shm::supervise",
               "blocking_cleanup_dead_nodes")
DEAD_NODES = "cleanup_dead_nodes"
ORT_LIBRARY = "libonnxruntime"
# Each measured case's thread files, and the requests counted, by run label.
DUMPS = {}
REQUESTS = {}

# (layer, patterns): the first layer whose pattern a function's "file:symbol" holds.
LAYERS = [
    ("engine", ["libonnxruntime", "tickserve_engine_ort", "tickserve-engine-ort", "/ort-"]),
    ("journal", ["tickserve_journal", "tickserve-journal"]),
    ("metrics", ["metrics", "tickserve_server::observe", "tickserve-server/src/observe",
                 "tickserve_edge::observe", "tickserve-edge/src/observe"]),
    ("allocation", ["jemalloc", "__rust_alloc", "__rust_dealloc", "__rust_realloc",
                    "__rdl_", "alloc::raw_vec"]),
    ("copies", ["memmove", "memcpy", "memset", "memcmp"]),
    ("protocol", ["prost", "serde", "tickserve_proto", "tickserve-proto", "shm_protocol",
                  "shm-protocol", "tickserve_server::grpc::", "tickserve-server/src/grpc/",
                  "tickserve_server::http::", "tickserve-server/src/http/",
                  "tickserve_server::tfserving", "tickserve-server/src/tfserving",
                  "tickserve_server::shm", "tickserve-server/src/shm", "tonic::codec",
                  "tonic-0.14.9/src/codec", "base64", "ryu", "itoa"]),
    ("edge", ["tickserve_edge", "tickserve-edge/src"]),
    ("runtime", ["tickserve_runtime", "tickserve-runtime", "tickserve_core",
                 "tickserve-core"]),
    ("transport", ["tokio", "hyper", "/h2-", "h2::", "tonic", "axum", "tower", "iceoryx2",
                   "iceoryx", "/http-", "http::", "http_body", "/bytes-", "bytes::", "mio",
                   "tickserve_server::transport", "tickserve-server/src/transport",
                   "tickserve_server::listen", "tickserve-server/src/listen",
                   "tickserve_server::ports", "tickserve-server/src/ports",
                   "tickserve_server::", "tickserve-server/src/", "futures", "slab",
                   "parking_lot", "crossbeam", "tracing"]),
    ("kernel/libc", ["libc.so", "ld-linux", "libpthread", "vdso", "std::sys", "std/src/sys"]),
]
# `periodic`: the shared-memory thread's dead-client check (every 100 ms, whatever
# the load), taken out of the shared-memory cases' counts in a column of its own: its
# work is spread over the other columns, which callgrind cannot split by caller.
ORDER = [name for name, _ in LAYERS] + ["other", "periodic"]


def layer_of(name):
    low = name.lower()
    for layer, patterns in LAYERS:
        if any(p in low for p in patterns):
            return layer
    return "other"


def exclusive(path):
    """{file:function: own instructions} of one callgrind file."""
    text = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", str(path)],
                          capture_output=True, text=True, check=True).stdout
    costs = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in m.group(2):
            costs[m.group(2)] = costs.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return costs


def inclusive(path, function):
    """The instructions of `function` and what it calls, in one callgrind file."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no",
                           "--threshold=100", str(path)],
                          capture_output=True, text=True, check=True).stdout
    best = 0
    for line in text.splitlines():
        if function in line:
            m = re.match(r"\s*([\d,]+)", line)
            if m:
                best = max(best, int(m.group(1).replace(",", "")))
    return best


def engine_calls(path):
    """The instructions of every call into ONNX Runtime from outside it (inclusive:
    what the library does and every libc call it makes), in one callgrind file."""
    text = subprocess.run(["callgrind_annotate", "--tree=calling", "--inclusive=yes",
                           "--auto=no", "--threshold=100", str(path)],
                          capture_output=True, text=True, check=True).stdout
    total, caller_outside = 0, False
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+([*>])\s", line)
        if not m:
            continue
        if m.group(2) == "*":
            caller_outside = ORT_LIBRARY not in line
        elif caller_outside and ORT_LIBRARY in line:
            total += int(m.group(1).replace(",", ""))
    return total


def counted(path, case):
    """Whether `path` (one thread's file) counts for `case` (see `count`)."""
    text = path.read_text(errors="replace")
    shm_thread = any(marker in text for marker in SHM_THREADS)
    shm_case = case.startswith("shm") or case == "shared memory"
    return not (UPKEEP in text or (shm_thread and not shm_case))


def inclusive_sum(paths, patterns):
    """{pattern: the instructions of the function whose line holds it, inclusive,
    summed over `paths` (a request's work may be spread over several threads)}."""
    sums = dict.fromkeys(patterns, 0)
    for path in paths:
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no",
                               "--threshold=100", str(path)],
                              capture_output=True, text=True, check=True).stdout
        here = dict.fromkeys(patterns, 0)
        for line in text.splitlines():
            m = re.match(r"\s*([\d,]+) \(", line)
            if not m:
                continue
            for pattern in patterns:
                if pattern in line:
                    here[pattern] = max(here[pattern], int(m.group(1).replace(",", "")))
        for pattern in patterns:
            sums[pattern] += here[pattern]
    return sums


# Where a front end's overhead goes: (part, [(sign, pattern, in the case or its floor)]).
# A part is the inclusive count of the functions named, less the same in the floor
# where the floor runs them too; `engine` is ONNX Runtime's calls.
PARTS = {
    "v2 gRPC unary": [
        ("request decoding: the message read in place (`view::infer_request`), its names "
         "and shapes into the core's request (`Read::of`), the frame taken (`FrameDecoder`)",
         [(1, "view::infer_request", "case"), (1, "Read::of", "case"),
          (1, "FrameDecoder as tonic::codec::Decoder>::decode", "case")]),
        # The encoder's call is inlined into tonic's EncodeBody in some builds.
        ("answer encoding: `UnaryAnswer::encode` (the answer written from the core's response, "
         "dropped after)", [(1, "grpc::fast::answer::UnaryAnswer::encode", "case")]),
        ("timing headers: `timing::add`, tonic's `into_sanitized_headers`, HPACK's "
         "`Encoder::encode`",
         [(1, "tickserve_server::timing::add", "case"),
          (1, "into_sanitized_headers", "case"), (-1, "into_sanitized_headers", "floor"),
          (1, "hpack::encoder::Encoder::encode", "case"),
          (-1, "hpack::encoder::Encoder::encode", "floor")]),
        ("edge, before the run: `Edge::admit_now` (lookup, admission, the core's request, "
         "validation)", [(1, "Edge>::admit_now", "case")]),
        ("runtime: `ModelHandle::run_now` less ONNX Runtime's calls (run at once, copies "
         "in and out, statistics)", [(1, "ModelHandle::run_now", "case"),
                                     (-1, "engine", "case")]),
        ("edge, after the run: `Admitted::run_now` less `ModelHandle::run_now` (metrics, "
         "the answer)", [(1, "Admitted<E>::run_now", "case"),
                         (-1, "ModelHandle::run_now", "case")]),
        ("the gRPC handler: `unary::Method` less the parts above (deadline, trace and key "
         "lookups, the answer's header map, the boxed future)",
         [(1, "Method as tonic::server::service::UnaryService", "case"),
          (-1, "Edge>::admit_now", "case"), (-1, "Admitted<E>::run_now", "case"),
          (-1, "tickserve_server::timing::add", "case"),
          (-1, "view::infer_request", "case"), (-1, "Read::of", "case")]),
    ],
    "v2 HTTP binary": [
        ("request decoding: `JsonBody::decode` (the JSON header, read by hand where it is "
         "plain JSON; the binary split)",
         [(1, "JsonBody as tickserve_edge::infer::Payload>::decode", "case")]),
        ("answer encoding: `http::codec::encode` (the JSON header, binary outputs)",
         [(1, "tickserve_server::http::codec::encode", "case")]),
        ("reading the body: `body::read_request` (its limits)",
         [(1, "body::read_request::{{closure}}", "case")]),
        ("answer headers: `reply::headers` (a map made once per kind of answer, cloned, "
         "its values set: the timing headers, the content type and lengths)",
         [(1, "tickserve_server::http::reply::headers", "case")]),
        ("edge, before the run: `Edge::admit_now` less the decoding (lookup, admission, "
         "the core's request, validation)",
         [(1, "Edge>::admit_now", "case"),
          (-1, "JsonBody as tickserve_edge::infer::Payload>::decode", "case")]),
        ("runtime: `ModelHandle::run_now` less ONNX Runtime's calls",
         [(1, "ModelHandle::run_now", "case"), (-1, "engine", "case")]),
        ("edge, after the run: `Admitted::run_now` less `ModelHandle::run_now` (metrics, "
         "the answer)", [(1, "Admitted<E>::run_now", "case"),
                         (-1, "ModelHandle::run_now", "case")]),
        ("the route: `HttpRoute::parse` less the floor's (a longer path, the model's name)",
         [(1, "HttpRoute::parse", "case"), (-1, "HttpRoute::parse", "floor")]),
    ],
}


def parts(label, results, case):
    """The parts table of `case` (see PARTS), the rest in the last row."""
    kind, total, _, engine = results[case]
    floor = results[kind][1]
    named = {pattern for _, terms in PARTS[case] for _, pattern, _ in terms} - {"engine"}
    got = {"case": inclusive_sum(DUMPS[(label, case)], named),
           "floor": inclusive_sum(DUMPS[(label, kind)], named)}
    requests = {"case": REQUESTS[label], "floor": REQUESTS[label]}
    lines = [f"| {case}: part | instructions / request |", "| --- | ---: |"]
    left = total - floor - engine
    for name, terms in PARTS[case]:
        value = sum(sign * (engine if pattern == "engine" else got[where][pattern] / requests[where])
                    for sign, pattern, where in terms)
        left -= value
        lines.append(f"| {name} | {value:,.0f} |")
    lines.append(f"| the rest: the edge and handler not named above, and the transport's and "
                 f"allocator's work for a larger request and answer than the floor's | {left:,.0f} |")
    lines.append(f"| **overhead above the floors** | **{total - floor - engine:,.0f}** |")
    return "\n".join(lines)


def count(paths, shm_case):
    """(total, {layer: instructions}, engine) over one dump's thread files, the
    periodic work left out (see UPKEEP); `engine` is ONNX Runtime's calls inclusive
    of what they call (see `engine_calls`)."""
    layers = dict.fromkeys(ORDER, 0)
    engine = 0
    for path in paths:
        text = path.read_text(errors="replace")
        shm_thread = any(marker in text for marker in SHM_THREADS)
        if UPKEEP in text or (shm_thread and not shm_case):
            continue
        for function, cost in exclusive(path).items():
            layers[layer_of(function)] += cost
        if ORT_LIBRARY in text:
            engine += engine_calls(path)
        if shm_thread:
            layers["periodic"] -= inclusive(path, DEAD_NODES)
    return sum(layers.values()), layers, engine


class Clients:
    """One client per case, each sending one-row alpha_mlp requests."""

    def __init__(self, http, grpc_address, service, work):
        import grpc
        import tritonclient.grpc as tgrpc
        import tritonclient.http as thttp
        from tfserving_check import stubs
        from tickserve_client import ShmClient, protocol, shm
        # Under valgrind an answer can take longer than the client's 0.1 s liveness
        # check, which then reads a slow server as gone: wait as long as the timeout.
        shm.LIVENESS_CHECK_S = 60.0
        self.tgrpc, self.thttp, self.protocol = tgrpc, thttp, protocol
        self.http_address = http
        self.x = np.random.default_rng(0).standard_normal((1, FEATURES)).astype(np.float32)
        self.http = thttp.InferenceServerClient(http)
        self.grpc = tgrpc.InferenceServerClient(grpc_address)
        self.stream = tgrpc.InferenceServerClient(grpc_address)
        self.answers = queue.Queue()
        self.stream.start_stream(callback=lambda result, error: self.answers.put(error))
        self.shm = ShmClient(service, timeout=60.0)
        predict_pb2, _, _, prediction_grpc, _ = stubs(work)
        self.predict = predict_pb2
        self.tf = prediction_grpc.PredictionServiceStub(grpc.insecure_channel(grpc_address))
        from tensorflow.core.framework import tensor_pb2
        tensor = tensor_pb2.TensorProto(dtype=1)
        for d in self.x.shape:
            tensor.tensor_shape.dim.add(size=d)
        tensor.tensor_content = self.x.tobytes()
        self.tf_request = predict_pb2.PredictRequest()
        self.tf_request.model_spec.name = "alpha_mlp"
        self.tf_request.inputs["features"].CopyFrom(tensor)
        self.tfs_body = json.dumps({"instances": self.x.tolist()}).encode()
        self.shm.infer("alpha_mlp", {"features": self.x})
        self.stale = protocol.infer_request(1, 0xFFFF_FFFF, 5_000_000,
                                            [(b"features", self.x)], None)

    def cases(self):
        """(name, kind, send): kind is `infer` or the floor a front end stands on."""
        def v2_input(module, binary=True):
            inp = module.InferInput("features", [1, FEATURES], "FP32")
            if module is self.thttp:
                inp.set_data_from_numpy(self.x, binary_data=binary)
            else:
                inp.set_data_from_numpy(self.x)
            return inp

        def stream(model="alpha_mlp"):
            self.stream.async_stream_infer(model, [v2_input(self.tgrpc)])
            error = self.answers.get(timeout=60)
            if (error is None) != (model == "alpha_mlp"):
                raise RuntimeError(f"{model} on the stream: {error}")

        def tfs_rest():
            request = urllib.request.Request(
                f"http://{self.http_address}/v1/models/alpha_mlp:predict", data=self.tfs_body,
                method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request) as r:
                r.read()

        def stale():
            try:
                self.protocol.read_answer(self.shm._call(self.stale))
            except self.protocol.ServerError:
                return
            raise RuntimeError("a stale shared-memory handle was answered")

        def live():
            with urllib.request.urlopen(f"http://{self.http_address}/v2/health/live") as r:
                r.read()

        return [
            ("grpc ServerLive", "floor", lambda: self.grpc.is_server_live()),
            ("http GET /v2/health/live", "floor", lambda: self.http.is_server_live()),
            ("http GET /v2/health/live, a connection each", "floor", live),
            ("grpc stream, unknown model", "floor", lambda: stream("no_such_model")),
            ("shm stale handle", "floor", stale),
            ("v2 gRPC unary", "grpc ServerLive",
             lambda: self.grpc.infer("alpha_mlp", [v2_input(self.tgrpc)])),
            ("v2 gRPC stream", "grpc stream, unknown model", stream),
            ("v2 HTTP JSON", "http GET /v2/health/live",
             lambda: self.http.infer("alpha_mlp", [v2_input(self.thttp, binary=False)])),
            ("v2 HTTP binary", "http GET /v2/health/live",
             lambda: self.http.infer("alpha_mlp", [v2_input(self.thttp)])),
            ("TF Serving REST", "http GET /v2/health/live, a connection each", tfs_rest),
            ("TF Serving gRPC", "grpc ServerLive",
             lambda: self.tf.Predict(self.tf_request, timeout=60)),
            ("shared memory", "shm stale handle",
             lambda: self.shm.infer("alpha_mlp", {"features": self.x})),
        ]

    def close(self):
        self.stream.stop_stream()


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def measure(binary, label, requests, warmup, config):
    """Runs every case against `binary` under callgrind: {case: (per request, layers)}."""
    out = OUT / label
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("callgrind.*"):
        old.unlink()
    results = {}
    REQUESTS[label] = requests
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        service = f"tickserve-instructions-{os.getpid()}"
        text = pathlib.Path(config).read_text()
        # The sample configuration with the shared-memory front end on, under a
        # service name of its own, and without its spin.
        start = text.index("\n[shm]\n")
        end = text.index("\n[", start + 1)
        shm = text[start:end].replace("enabled = false", "enabled = true", 1)
        shm = re.sub(r'service = "[^"]*"', f'service = "{service}"', shm, count=1)
        # No polling after a request: the count is the work, not the wait.
        shm = re.sub(r'spin = "[^"]*"', 'spin = "0s"', shm, count=1)
        text = text[:start] + shm + text[end:]
        # Under valgrind a run is some fifty times slower than natively, so the
        # load-time check of `inline_budget` would pass or fail with the machine's
        # load; a budget far above it keeps every case on the path a native server
        # takes for a one-row alpha_mlp (run at once on the caller's thread).
        text = re.sub(r'inline_budget = "[^"]*"', 'inline_budget = "1s"', text, count=1)
        assert tomllib.loads(text)["shm"]["enabled"]
        assert tomllib.loads(text)["runtime"]["inline_budget"] == "1s"
        (work / "tickserve.toml").write_text(text)
        wrapper = work / "tickserve-under-callgrind"
        wrapper.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes "
            f"--callgrind-out-file={out}/callgrind.out {binary} \"$@\"\n")
        wrapper.chmod(0o755)
        with Server(config=work / "tickserve.toml", binary=wrapper,
                    log=out / "server.log", ready_timeout=600) as server:
            clients = Clients(f"127.0.0.1:{server.http_port}",
                              f"127.0.0.1:{server.grpc_port}", service, work)
            control(server.pid, "-i", "on")
            for dump, (name, kind, send) in enumerate(clients.cases(), start=1):
                for _ in range(warmup):
                    send()
                control(server.pid, "-z")
                for _ in range(requests):
                    send()
                control(server.pid, "-d")
                time.sleep(1)
                paths = sorted(out.glob(f"callgrind.out.{dump}-*"))
                total, layers, engine = count(paths, shm_case=name.startswith("shm")
                                              or name == "shared memory")
                results[name] = (kind, total / requests,
                                 {k: v / requests for k, v in layers.items()},
                                 engine / requests)
                DUMPS[(label, name)] = [p for p in paths if counted(p, name)]
                print(f"{label}: {name}: {total / requests:,.0f} instructions per request",
                      file=sys.stderr, flush=True)
            control(server.pid, "-i", "off")
            clients.close()
    return results


def table(results):
    """The front ends' counts against their floors."""
    lines = ["| front end | instructions / request | transport floor | engine | overhead "
             "above the floors |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, (kind, total, _, engine) in results.items():
        if kind == "floor":
            continue
        floor = results[kind][1]
        lines.append(f"| {name} | {total:,.0f} | {floor:,.0f} ({kind}) | {engine:,.0f} "
                     f"| {total - floor - engine:,.0f} |")
    lines += ["", "| floor | instructions / request |", "| --- | ---: |"]
    for name, (kind, total, *_) in results.items():
        if kind == "floor":
            lines.append(f"| {name} | {total:,.0f} |")
    lines += ["", "| case | " + " | ".join(ORDER) + " |",
              "| --- |" + " ---: |" * len(ORDER)]
    for name, (_, _, layers, _) in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{layers[k]:,.0f}" for k in ORDER) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=500, help="counted requests per case")
    p.add_argument("--warmup", type=int, default=200, help="requests before counting")
    p.add_argument("--binary", default=str(ROOT / "target/release/tickserve"))
    p.add_argument("--old", help="compare: the old binary")
    p.add_argument("--new", help="compare: the new binary")
    p.add_argument("--config", default=str(ROOT / "config/tickserve.toml"),
                   help="the server's configuration (the shared-memory front end is turned on)")
    p.add_argument("--old-config", help="compare: the old server's configuration (default --config)")
    p.add_argument("--new-config", help="compare: the new server's configuration (default --config)")
    args = p.parse_args()
    if bool(args.old) != bool(args.new):
        sys.exit("--old and --new go together")
    if not args.old:
        results = measure(args.binary, "run", args.requests, args.warmup, args.config)
        print(table(results))
        for case in PARTS:
            print()
            print(parts("run", results, case))
        (OUT / "run" / "results.json").write_text(json.dumps(results, indent=1))
        return
    old = measure(args.old, "old", args.requests, args.warmup, args.old_config or args.config)
    new = measure(args.new, "new", args.requests, args.warmup, args.new_config or args.config)
    print("| case | old | new | new / old |")
    print("| --- | ---: | ---: | ---: |")
    for name in old:
        a, b = old[name][1], new[name][1]
        print(f"| {name} | {a:,.0f} | {b:,.0f} | {b / a:.3f} |")
    print("\nold:\n")
    print(table(old))
    print("\nnew:\n")
    print(table(new))
    for case in PARTS:
        print()
        print(parts("new", new, case))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Scale-out under a real load balancer: three tickserve replicas of one fleet (`[fleet]`,
an etcd on loopback: Debian's etcd-server) behind HAProxy (deploy/haproxy/haproxy.cfg),
while one replica drains and comes back and another is killed.

    scripts/scaleout/scaleout_check.sh [BINARY]        # installs HAProxy if missing; default target/debug/tickserve
    .venv/bin/python scripts/scaleout/scaleout_check.py [BINARY] [--sequences 200] [--ticks 200]

SEQUENCES sequences of TICKS ticks each of `seq_lstm_step` (recurrent state) and of
`seq_lstm_window` (a 30-tick window) from 8 clients, 4 over HTTP and 4 over gRPC
(tritonclient, the `tickserve-sequence-id` header on every tick), through the balancer;
every tick also goes to a fourth server alone, the reference. At a third of the run
replica r1 is drained (SIGTERM) and started again; at two thirds replica r2 is killed
(SIGKILL). A tick refused as not run ("was not run", or the balancer's own error while
a replica leaves) is retried, and so is one whose connection the balancer closed
mid-answer (the killed replica had it: its state is gone, the retry says so). Passes when:

- every answer equals the same sequence's answer from the server alone (within 1e-6),
  except that a sequence whose replica was killed gets, from its first tick after the
  kill on, the "state is lost" error on every tick and no answer;
- no tick was applied twice: every sequence still kept at the end has exactly TICKS
  ticks (each replica's sequence list);
- the drain handed sequences over (some sequence's ticks went on elsewhere).

Its last lines: the ticks retried, the drain's duration, p50/p99 of the balanced ticks
during the drain and over the whole run, the sequences lost to the kill.
"""
import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import json

import numpy as np

# A replica is started again while the gRPC clients run: without this, gRPC's fork
# handlers run in the forked child before it execs tickserve, and can abort it
# (`epoll_wait error: Bad file descriptor`, then SIGABRT). Read when grpc loads.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "scaleout"))
from bench_common import free_port  # noqa: E402
from balancer import Balancer  # noqa: E402
from server import Server  # noqa: E402

MODELS = {"seq_lstm_step": ("tick", 0), "seq_lstm_window": ("window", 100_000)}
CLIENTS = 8
TOLERANCE = 1e-6
RETRY_PAUSE = 0.02
RETRY_FOR = 30.0


PREFIX = "scaleout"


class Etcd:
    """One etcd member on free loopback ports, its data in `work`, until stop()."""

    def __init__(self, work):
        client, peer = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.log = work / "etcd.log"
        self.process = subprocess.Popen(
            ["etcd", "--name", "e", "--data-dir", str(work / "etcd"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"e={peer_url}"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while self.ctl("endpoint", "health").returncode != 0:
            if time.monotonic() > deadline or self.process.poll() is not None:
                sys.exit(f"etcd did not start:\n{self.log.read_text()}")
            time.sleep(0.1)

    def ctl(self, *args):
        return subprocess.run(["etcdctl", "--endpoints", self.endpoint, *args],
                              env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, text=True)

    def keys(self, prefix):
        return set(self.ctl("get", "--prefix", "--keys-only", prefix).stdout.split())

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def config(work, etcd):
    path = work / ("replica.toml" if etcd else "alone.toml")
    lines = ['[repository]', f'path = "{ROOT / "config/models"}"',
             '[runtime]', f'onnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"']
    if etcd:
        lines += ['[fleet]', f'endpoints = ["{etcd.endpoint}"]', f'prefix = "{PREFIX}"',
                  'lease = "3s"', 'handoff_wait = "2s"']
    path.write_text("\n".join(lines) + "\n")
    return path


def tick_values(sequence, t):
    return np.random.default_rng(sequence * 1000 + t).uniform(-1, 1, (1, 8)).astype(np.float32)


class Client:
    """One client thread's connections: through the balancer and to the server alone."""

    def __init__(self, grpc, lb, alone):
        self.module = grpcclient if grpc else httpclient
        address = lb[1] if grpc else lb[0]
        alone_address = alone[1] if grpc else alone[0]
        self.lb = self.module.InferenceServerClient(address)
        self.alone = self.module.InferenceServerClient(alone_address)

    def infer(self, client, model, sequence, t):
        name, _ = MODELS[model]
        x = self.module.InferInput(name, [1, 8], "FP32")
        x.set_data_from_numpy(tick_values(sequence, t))
        result = client.infer(model, [x], sequence_id=sequence, sequence_start=(t == 0),
                              headers={"tickserve-sequence-id": str(sequence)})
        return float(result.as_numpy("prediction")[0, 0])


def retryable(message):
    """A tick that was not run: tickserve said so, or the balancer answered for a replica
    that is leaving (no tickserve message at all)."""
    if "was not run" in message:
        return True
    ours = ("model '" in message) or ("sequence" in message)
    return not ours


class Run:
    def __init__(self, sequences, ticks):
        self.sequences = sequences
        self.ticks = ticks
        self.lock = threading.Lock()
        self.done = 0
        self.retries = 0
        self.closed = 0
        self.latencies = []  # (finished at, seconds) of balanced ticks
        self.answers = {}  # (model, sequence) -> list of (balanced, alone) or ("lost", alone)
        self.failures = []

    def client(self, index, lb, alone):
        c = Client(index >= CLIENTS // 2, lb, alone)
        mine = [(model, offset + s) for model, (_, offset) in MODELS.items()
                for s in range(1, self.sequences + 1) if (offset + s) % CLIENTS == index]
        for key in mine:
            self.answers[key] = []
        for t in range(self.ticks):
            for model, sequence in mine:
                started = time.monotonic()
                balanced, retries, closed = None, 0, 0
                while True:
                    try:
                        balanced = c.infer(c.lb, model, sequence, t)
                        break
                    except Exception as e:  # noqa: BLE001  (tritonclient's, or its transport's)
                        # A connection the balancer closed mid-answer: a replica was
                        # killed with the tick on it (its state is gone with it).
                        message = str(e) if isinstance(e, InferenceServerException) else \
                            f"the balancer closed the connection: {e!r}"
                        if "closed" in message and not isinstance(e, InferenceServerException):
                            closed += 1
                        if "state is lost" in message:
                            balanced = "lost"
                            break
                        if not retryable(message) or time.monotonic() - started > RETRY_FOR:
                            balanced = f"error: {message}"
                            break
                        retries += 1
                        time.sleep(RETRY_PAUSE)
                finished = time.monotonic()
                want = c.infer(c.alone, model, sequence, t)
                with self.lock:
                    self.done += 1
                    self.retries += retries
                    self.closed += closed
                    if not isinstance(balanced, str):
                        self.latencies.append((finished, finished - started))
                    self.answers[(model, sequence)].append((balanced, want))


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def kept_ticks(port):
    """Each kept sequence's tick count on the replica at `port`, per model."""
    out = {}
    for model in MODELS:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/sequences",
                                    timeout=10) as r:
            for q in json.loads(r.read())["sequences"]:
                out[(model, int(q["sequence_id"]))] = int(q["ticks"])
    return out


def handed_in_store(etcd):
    """The sequences whose state lies handed over, unclaimed, in the fleet's store."""
    out = set()
    for key in etcd.keys(f"{PREFIX}/state/"):
        model, _, sequence = key[len(PREFIX) + len("/state/"):].partition("/")
        if sequence.startswith("-%0An"):
            out.add((model, int(sequence[len("-%0An"):])))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binary", nargs="?", default=str(ROOT / "target/debug/tickserve"))
    parser.add_argument("--sequences", type=int, default=200, help="sequences per model")
    parser.add_argument("--ticks", type=int, default=200, help="ticks per sequence")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tickserve-scaleout-") as work:
        work = pathlib.Path(work)
        etcd = Etcd(work)
        replica_config = config(work, etcd)
        ports = [(free_port(), free_port()) for _ in range(3)]
        replicas = [Server(config=replica_config, binary=args.binary, http_port=h, grpc_port=g,
                           log=work / f"r{i}.log") for i, (h, g) in enumerate(ports, 1)]
        for r in replicas:
            r.start()
        alone = Server(config=config(work, None), binary=args.binary, log=work / "alone.log")
        alone.start()
        balancer = Balancer(work, ports)
        try:
            balancer.__enter__()
            run = Run(args.sequences, args.ticks)
            total = 2 * args.sequences * args.ticks
            lb = (balancer.http, balancer.grpc)
            solo = (f"127.0.0.1:{alone.http_port}", f"127.0.0.1:{alone.grpc_port}")
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                futures = [pool.submit(run.client, i, lb, solo) for i in range(CLIENTS)]
                while run.done < total // 3 and not any(f.done() for f in futures):
                    time.sleep(0.01)
                drain_start = time.monotonic()
                replicas[0].stop()
                drain_end = time.monotonic()
                drained_log = replicas[0].log
                replicas[0].log = work / "r1-again.log"
                replicas[0].start()
                while run.done < 2 * total // 3 and not any(f.done() for f in futures):
                    time.sleep(0.01)
                on_killed = kept_ticks(replicas[1].http_port)
                replicas[1].process.kill()
                replicas[1].process.wait()
                for f in futures:
                    f.result()
            elapsed = time.monotonic() - started
            kept = {}
            for r in (replicas[0], replicas[2]):
                kept.update(kept_ticks(r.http_port))
            in_store = handed_in_store(etcd)

            worst, lost, errors, wrong, twice = 0.0, [], [], [], []
            for key, answers in run.answers.items():
                first_lost = next((t for t, (b, _) in enumerate(answers) if b == "lost"), None)
                for t, (balanced, want) in enumerate(answers):
                    if first_lost is not None and t >= first_lost:
                        if balanced != "lost":
                            wrong.append(f"{key} tick {t}: answered after its state was lost")
                        continue
                    if isinstance(balanced, str):
                        errors.append(f"{key} tick {t}: {balanced[:300]}")
                        continue
                    worst = max(worst, abs(balanced - want))
                if first_lost is not None:
                    lost.append(key)
                elif key in kept:
                    if kept[key] != args.ticks:
                        twice.append(f"{key}: kept with {kept[key]} ticks, not {args.ticks}")
                elif key not in on_killed and key not in in_store:
                    # Every tick answered, on the killed replica (no tick came
                    # after the kill) or handed over and never claimed since.
                    wrong.append(f"{key}: kept nowhere")
            handed = [line for line in drained_log.read_text().splitlines()
                      if "sequences handed over for the drain" in line]
            during = [s for at, s in run.latencies if drain_start <= at <= drain_end + 2.0]
            every = [s for _, s in run.latencies]
            print(f"{2 * args.sequences} sequences x {args.ticks} ticks from {CLIENTS} clients through "
                  f"HAProxy in {elapsed:.1f} s; r1 drained and restarted at a third, r2 killed at two thirds")
            print(f"largest difference from the server alone: {worst:.2e}")
            print(f"ticks retried: {run.retries} ({run.closed} after the balancer closed the connection)")
            print(f"r1's drain: {handed[-1].split('INFO')[-1].strip() if handed else 'no hand-over logged'}")
            print(f"drain of r1: {drain_end - drain_start:.2f} s; balanced ticks during it (and 2 s after): "
                  f"{len(during)}, p50 {percentile(during, 50) * 1e3:.1f} ms, p99 {percentile(during, 99) * 1e3:.1f} ms")
            print(f"balanced ticks over the run: p50 {percentile(every, 50) * 1e3:.1f} ms, "
                  f"p99 {percentile(every, 99) * 1e3:.1f} ms")
            print(f"sequences lost to the kill of r2: {len(lost)} of {len(run.answers)}; "
                  f"sequences with a tick applied twice: {len(twice)}")
            for line in (errors + wrong + twice)[:20]:
                print(f"  {line}")
            assert not errors, f"{len(errors)} ticks failed"
            assert not wrong and not twice, f"{len(wrong) + len(twice)} sequences went wrong"
            assert worst <= TOLERANCE, f"answers differ from the server alone by {worst}"
            assert 0 < len(lost) < len(run.answers), "the kill should lose some sequences, not all"
            assert handed and "sequences=0 " not in handed[-1], "r1 handed nothing over at its drain"
            print("scale-out check: passed")
        finally:
            balancer.__exit__()
            alone.stop()
            for r in replicas:
                r.stop()
            etcd.stop()


if __name__ == "__main__":
    main()

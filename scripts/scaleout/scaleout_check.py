#!/usr/bin/env python3
"""Scale-out under a real load balancer: three tickserve replicas of one fleet (`[fleet]`,
an etcd on loopback: Debian's etcd-server) behind HAProxy (deploy/haproxy/haproxy.cfg),
while one replica drains and comes back and another is killed.

    scripts/scaleout/scaleout_check.sh [BINARY]        # installs HAProxy if missing; default target/debug/tickserve
    .venv/bin/python scripts/scaleout/scaleout_check.py [BINARY] [--sequences 200] [--ticks 200]

SEQUENCES sequences of TICKS ticks each of `seq_lstm_step` (recurrent state, served at
versions 1 and 2 side by side: `version_policy = { latest = 2 }`), of `seq_lstm_step`
started on version 1 by name (every later tick names no version and must stay there), and
of `seq_lstm_window` (a 30-tick window), from 8 clients, 4 over HTTP and 4 over gRPC
(tritonclient, the `tickserve-sequence-id` header on every tick), through the balancer;
every tick also goes to a fourth server alone, the reference. At a third of the run
replica r1 is drained (SIGTERM) and started again; at two thirds replica r2 is killed
(SIGKILL); at half of its ticks every tenth sequence is started again on r3 directly,
whatever replica kept it. A tick refused as not run ("was not run", or the balancer's
own error while a replica leaves) is retried, and so is one whose connection the balancer
closed mid-answer (the killed replica had it: its state is gone, the retry says so).
Meanwhile a ninth client sends stateless `tick_000` requests through the balancer, and at
half of the run `tick_000` version 1 is halted through the balancer's admin front (the
`risk` key), then 20 halts and resumes of `tick_001` measure how long a halt takes to be
applied by every replica. Passes when:

- every answer equals the same sequence's answer from the server alone (within 1e-6),
  on the same version, except that a sequence whose replica was killed gets, from its
  first tick after the kill on, the "state is lost" error on every tick and no answer;
- no tick was applied twice: every sequence still kept at the end has exactly TICKS
  ticks since its last start (each replica's sequence list);
- the drain handed sequences over (some sequence's ticks went on elsewhere);
- no `tick_000` request sent after the halt's answer was answered, on any replica (each
  replica asked directly too), and every halt was applied by all three replicas.

Its last lines: the ticks retried, the drain's duration, p50/p99 of the balanced ticks
during the drain and over the whole run, the sequences lost to the kill, the halt's
propagation (p50/p99 of the time the halt's answer waited for every replica).
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
import urllib.error
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

# Each kind of sequence: (model, input, first sequence id, the version its start names).
KINDS = {"step": ("seq_lstm_step", "tick", 0, None),
         "window": ("seq_lstm_window", "window", 100_000, None),
         "step_v1": ("seq_lstm_step", "tick", 200_000, "1")}
MODELS = ("seq_lstm_step", "seq_lstm_window")
RESTART_EVERY = 10
RISK_KEY = "scaleout-risk-officer"
HALT_CYCLES = 20
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


def repository(work):
    """The models the check serves: seq_lstm_step at versions 1 and 2 side by side,
    seq_lstm_window, tick_000 and tick_001 (copies of config/models)."""
    import shutil
    repo = work / "models"
    for name in ("seq_lstm_step", "seq_lstm_window", "tick_000", "tick_001"):
        shutil.copytree(ROOT / "config/models" / name, repo / name)
    step = repo / "seq_lstm_step"
    shutil.copytree(step / "1", step / "2")
    toml = step / "model.toml"
    toml.write_text("version_policy = { latest = 2 }\n" + toml.read_text())
    return repo


def config(work, repo, etcd):
    path = work / ("replica.toml" if etcd else "alone.toml")
    lines = ['[repository]', f'path = "{repo}"',
             '[runtime]', f'onnxruntime_library = "{ROOT / ".local/lib/libonnxruntime.so.1.31.1"}"']
    if etcd:
        key = work / "risk.key"
        key.write_text(RISK_KEY + "\n")
        lines += ['[risk]', 'halts_file = ""  # the fleet keeps them',
                  '[[security.restricted]]', 'groups = ["risk"]', 'header = "risk-key"',
                  f'key_file = "{key}"',
                  '[fleet]', f'endpoints = ["{etcd.endpoint}"]', f'prefix = "{PREFIX}"',
                  'lease = "3s"', 'handoff_wait = "2s"']
    path.write_text("\n".join(lines) + "\n")
    return path


def tick_values(sequence, t):
    return np.random.default_rng(sequence * 1000 + t).uniform(-1, 1, (1, 8)).astype(np.float32)


class Client:
    """One client thread's connections: through the balancer, to the server alone, and
    to replica r3 directly (the restarts elsewhere)."""

    def __init__(self, grpc, lb, alone, direct):
        self.module = grpcclient if grpc else httpclient
        pick = (lambda pair: pair[1]) if grpc else (lambda pair: pair[0])
        self.lb = self.module.InferenceServerClient(pick(lb))
        self.alone = self.module.InferenceServerClient(pick(alone))
        self.direct = self.module.InferenceServerClient(pick(direct))
        self.grpc = grpc

    def infer(self, client, kind, sequence, t, start):
        model, name, _, start_version = KINDS[kind]
        x = self.module.InferInput(name, [1, 8], "FP32")
        x.set_data_from_numpy(tick_values(sequence, t))
        version = start_version if start else ""
        result = client.infer(model, [x], model_version=version or "", sequence_id=sequence,
                              sequence_start=start,
                              headers={"tickserve-sequence-id": str(sequence)})
        response = result.get_response()
        answered = response.model_version if self.grpc else response["model_version"]
        return float(result.as_numpy("prediction")[0, 0]), str(answered)


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
        self.answers = {}  # (kind, sequence) -> list of (balanced, want, restarted here)
        self.failures = []
        self.stateless = []  # (sent at, status) of the stateless client's requests

    def client(self, index, lb, alone, direct):
        c = Client(index >= CLIENTS // 2, lb, alone, direct)
        mine = [(kind, offset + s) for kind, (_, _, offset, _) in KINDS.items()
                for s in range(1, self.sequences + 1) if (offset + s) % CLIENTS == index]
        for key in mine:
            self.answers[key] = []
        for t in range(self.ticks):
            for kind, sequence in mine:
                # Every tenth sequence starts again at half its ticks, on r3 directly.
                restart = t == self.ticks // 2 and sequence % RESTART_EVERY == 0
                start = t == 0 or restart
                target = c.direct if restart else c.lb
                started = time.monotonic()
                balanced, retries, closed = None, 0, 0
                while True:
                    try:
                        balanced = c.infer(target, kind, sequence, t, start)
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
                want = c.infer(c.alone, kind, sequence, t, start)
                with self.lock:
                    self.done += 1
                    self.retries += retries
                    self.closed += closed
                    if not isinstance(balanced, str):
                        self.latencies.append((finished, finished - started))
                    self.answers[(kind, sequence)].append((balanced, want, restart))


def post(url, body=b"{}", key=None):
    """POSTs `body` to `url`: (status, answer as JSON or None)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["risk-key"] = key
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def stateless(address, run, stop):
    """The ninth client: `tick_000` through the balancer until `stop`; (sent at, status)."""
    while not stop.is_set():
        sent = time.monotonic()
        status, _ = post(f"http://{address}/v2/models/tick_000/infer", ROW)
        run.stateless.append((sent, status))
        time.sleep(0.002)


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def kind_of(model, sequence):
    """The kind of sequence `sequence` of `model` (by its id's range)."""
    if model == "seq_lstm_window":
        return "window"
    return "step_v1" if sequence >= KINDS["step_v1"][2] else "step"


def kept_ticks(port):
    """Each kept sequence's tick count on the replica at `port`, by (kind, sequence)."""
    out = {}
    for model, version in (("seq_lstm_step", 1), ("seq_lstm_step", 2), ("seq_lstm_window", 1)):
        url = f"http://127.0.0.1:{port}/v2/models/{model}/versions/{version}/sequences"
        request = urllib.request.Request(url, headers={"risk-key": RISK_KEY})
        with urllib.request.urlopen(request, timeout=10) as r:
            for q in json.loads(r.read())["sequences"]:
                sequence = int(q["sequence_id"])
                out[(kind_of(model, sequence), sequence)] = int(q["ticks"])
    return out


def handed_in_store(etcd):
    """The sequences whose state lies handed over, unclaimed, in the fleet's store."""
    out = set()
    for key in etcd.keys(f"{PREFIX}/state/"):
        model, _, sequence = key[len(PREFIX) + len("/state/"):].partition("/")
        if sequence.startswith("-%0An"):
            number = int(sequence[len("-%0An"):])
            out.add((kind_of(model, number), number))
    return out


def halt_cycles(admin, replicas):
    """HALT_CYCLES halts and resumes of tick_001 through the admin front: the seconds
    each halt's answer waited for every replica, and the halts some replica missed."""
    waited, missed = [], []
    for _ in range(HALT_CYCLES):
        status, answer = post(f"http://{admin}/v2/models/tick_001/versions/1/halt",
                              b'{"reason": "propagation"}', RISK_KEY)
        assert status == 200, f"halt through the balancer: {status} {answer}"
        waited.append(answer["fleet"]["waited_seconds"])
        if answer["fleet"]["applied"] != answer["fleet"]["replicas"] or not answer["kept"]:
            missed.append(answer)
        for r in replicas:
            status, _ = post(f"http://127.0.0.1:{r.http_port}/v2/models/tick_001/infer", ROW)
            if status != 423:
                missed.append(f"r{replicas.index(r) + 1} answered {status} after the halt")
        status, _ = post(f"http://{admin}/v2/models/tick_001/versions/1/resume", b"{}", RISK_KEY)
        assert status == 200
    return waited, missed


ROW = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                              "data": [0.1] * 16}]}).encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binary", nargs="?", default=str(ROOT / "target/debug/tickserve"))
    parser.add_argument("--sequences", type=int, default=200, help="sequences per model")
    parser.add_argument("--ticks", type=int, default=200, help="ticks per sequence")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tickserve-scaleout-") as work:
        work = pathlib.Path(work)
        etcd = Etcd(work)
        repo = repository(work)
        replica_config = config(work, repo, etcd)
        ports = [(free_port(), free_port()) for _ in range(3)]
        replicas = [Server(config=replica_config, binary=args.binary, http_port=h, grpc_port=g,
                           log=work / f"r{i}.log") for i, (h, g) in enumerate(ports, 1)]
        for r in replicas:
            r.start()
        alone = Server(config=config(work, repo, None), binary=args.binary, log=work / "alone.log")
        alone.start()
        balancer = Balancer(work, ports)
        try:
            balancer.__enter__()
            run = Run(args.sequences, args.ticks)
            total = len(KINDS) * args.sequences * args.ticks
            lb = (balancer.http, balancer.grpc)
            solo = (f"127.0.0.1:{alone.http_port}", f"127.0.0.1:{alone.grpc_port}")
            r3 = (f"127.0.0.1:{ports[2][0]}", f"127.0.0.1:{ports[2][1]}")
            stop = threading.Event()
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(CLIENTS + 1) as pool:
                futures = [pool.submit(run.client, i, lb, solo, r3) for i in range(CLIENTS)]
                plain = pool.submit(stateless, balancer.http, run, stop)
                while run.done < total // 3 and not any(f.done() for f in futures):
                    time.sleep(0.01)
                drain_start = time.monotonic()
                replicas[0].stop()
                drain_end = time.monotonic()
                drained_log = replicas[0].log
                replicas[0].log = work / "r1-again.log"
                replicas[0].start()
                while run.done < total // 2 and not any(f.done() for f in futures):
                    time.sleep(0.01)
                status, halted = post(f"http://{balancer.admin}/v2/models/tick_000/versions/1/halt",
                                      b'{"reason": "scale-out check"}', RISK_KEY)
                halt_answered = time.monotonic()
                assert status == 200, f"the halt through the balancer: {status} {halted}"
                refused_directly = [post(f"http://127.0.0.1:{h}/v2/models/tick_000/infer", ROW)[0]
                                    for h, _ in ports]
                while run.done < 2 * total // 3 and not any(f.done() for f in futures):
                    time.sleep(0.01)
                on_killed = kept_ticks(replicas[1].http_port)
                replicas[1].process.kill()
                replicas[1].process.wait()
                for f in futures:
                    f.result()
                stop.set()
                plain.result()
            elapsed = time.monotonic() - started
            waited, missed = halt_cycles(balancer.admin, [replicas[0], replicas[2]])
            kept = {}
            for r in (replicas[0], replicas[2]):
                kept.update(kept_ticks(r.http_port))
            in_store = handed_in_store(etcd)

            worst, lost, errors, wrong, twice = 0.0, [], [], [], []
            for key, answers in run.answers.items():
                first_lost = next((t for t, (b, _, _) in enumerate(answers) if b == "lost"), None)
                restarted_at = next((t for t, (_, _, r) in enumerate(answers) if r), None)
                # A sequence lost before its restart on r3 lives again from that tick.
                revived = restarted_at if first_lost is not None and restarted_at is not None \
                    and restarted_at > first_lost else None
                for t, (balanced, want, _) in enumerate(answers):
                    if first_lost is not None and t >= first_lost and (revived is None or t < revived):
                        if balanced != "lost":
                            wrong.append(f"{key} tick {t}: answered after its state was lost")
                        continue
                    if isinstance(balanced, str):
                        errors.append(f"{key} tick {t}: {balanced[:300]}")
                        continue
                    if balanced[1] != want[1]:
                        wrong.append(f"{key} tick {t}: answered by version {balanced[1]}, "
                                     f"the server alone by {want[1]}")
                    worst = max(worst, abs(balanced[0] - want[0]))
                since_start = args.ticks - (restarted_at or 0)
                if first_lost is not None:
                    lost.append(key)
                    if revived is None:
                        continue
                if key in kept:
                    if kept[key] != since_start:
                        twice.append(f"{key}: kept with {kept[key]} ticks, not {since_start}")
                elif key not in on_killed and key not in in_store:
                    # Every tick answered, on the killed replica (no tick came
                    # after the kill) or handed over and never claimed since.
                    wrong.append(f"{key}: kept nowhere")
            after_halt = [s for sent, s in run.stateless if sent > halt_answered and s == 200]
            before_halt = [s for sent, s in run.stateless if sent < halt_answered - 0.5 and s == 200]
            handed = [line for line in drained_log.read_text().splitlines()
                      if "sequences handed over for the drain" in line]
            during = [s for at, s in run.latencies if drain_start <= at <= drain_end + 2.0]
            every = [s for _, s in run.latencies]
            print(f"{len(KINDS) * args.sequences} sequences x {args.ticks} ticks from {CLIENTS} clients "
                  f"through HAProxy in {elapsed:.1f} s (seq_lstm_step at versions 1 and 2, "
                  f"seq_lstm_window); r1 drained and restarted at a third, r2 killed at two thirds, "
                  f"every {RESTART_EVERY}th sequence started again on r3 at half its ticks")
            print(f"largest difference from the server alone: {worst:.2e}")
            print(f"ticks retried: {run.retries} ({run.closed} after the balancer closed the connection)")
            print(f"r1's drain: {handed[-1].split('INFO')[-1].strip() if handed else 'no hand-over logged'}")
            print(f"drain of r1: {drain_end - drain_start:.2f} s; balanced ticks during it (and 2 s after): "
                  f"{len(during)}, p50 {percentile(during, 50) * 1e3:.1f} ms, p99 {percentile(during, 99) * 1e3:.1f} ms")
            print(f"balanced ticks over the run: p50 {percentile(every, 50) * 1e3:.1f} ms, "
                  f"p99 {percentile(every, 99) * 1e3:.1f} ms")
            print(f"sequences lost to the kill of r2: {len(lost)} of {len(run.answers)}; "
                  f"sequences with a tick applied twice: {len(twice)}; answered from a stale copy "
                  f"or on another version: {len(wrong)}")
            print(f"halt of tick_000 through the balancer: applied by {halted['fleet']['applied']} of "
                  f"{halted['fleet']['replicas']} replicas when answered; stateless requests answered "
                  f"before it: {len(before_halt)}, sent after its answer and answered: {len(after_halt)}; "
                  f"each replica asked directly after it: {refused_directly}")
            print(f"halt propagation over {HALT_CYCLES} halts (the answer waits for every replica): "
                  f"p50 {percentile(waited, 50) * 1e3:.1f} ms, p99 {percentile(waited, 99) * 1e3:.1f} ms, "
                  f"max {max(waited) * 1e3:.1f} ms; halts some replica missed: {len(missed)}")
            for line in (errors + wrong + twice)[:20] + [str(m) for m in missed[:5]]:
                print(f"  {line}")
            assert not errors, f"{len(errors)} ticks failed"
            assert not wrong and not twice, f"{len(wrong) + len(twice)} sequences went wrong"
            assert worst <= TOLERANCE, f"answers differ from the server alone by {worst}"
            assert 0 < len(lost) < len(run.answers), "the kill should lose some sequences, not all"
            assert handed and "sequences=0 " not in handed[-1], "r1 handed nothing over at its drain"
            assert before_halt, "the stateless client was never answered before the halt"
            assert not after_halt, f"{len(after_halt)} requests answered after the halt's answer"
            assert refused_directly == [423, 423, 423], f"after the halt: {refused_directly}"
            assert halted["fleet"]["applied"] == 3 and not missed, "a halt was not applied everywhere"
            print("scale-out check: passed")
        finally:
            balancer.__exit__()
            alone.stop()
            for r in replicas:
                r.stop()
            etcd.stop()


if __name__ == "__main__":
    main()

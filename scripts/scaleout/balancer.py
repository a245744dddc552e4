"""HAProxy with deploy/haproxy/haproxy.cfg in front of tickserve replicas on loopback, for
the checks that run through a real balancer (deploy/haproxy/check.py,
scripts/scaleout/scaleout_check.py).

    with Balancer(work, [(http_port, grpc_port), ...]) as lb:
        ...  # lb.http, lb.grpc, lb.admin (the operators' front): "127.0.0.1:PORT"
"""
import os
import pathlib
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_common import free_port  # noqa: E402


class Balancer:
    """HAProxy over `replicas` (each its HTTP and gRPC port), its log in `work`; ready once
    its HTTP front answers /v2/health/ready (a replica is up), else the check exits."""

    def __init__(self, work, replicas, ready_timeout=30.0):
        self.work = pathlib.Path(work)
        self.replicas = list(replicas)
        self.ready_timeout = ready_timeout
        http_port, grpc_port = free_port(), free_port()
        self.http = f"127.0.0.1:{http_port}"
        self.grpc = f"127.0.0.1:{grpc_port}"
        self.admin = f"127.0.0.1:{free_port()}"
        self.process = None

    def __enter__(self):
        env = dict(os.environ, TICKSERVE_LB_HTTP=self.http, TICKSERVE_LB_GRPC=self.grpc,
                   TICKSERVE_LB_ADMIN=self.admin)
        for i, (http_port, grpc_port) in enumerate(self.replicas, 1):
            env.update({f"TICKSERVE_R{i}": "127.0.0.1", f"TICKSERVE_R{i}_HTTP": str(http_port),
                        f"TICKSERVE_R{i}_GRPC": str(grpc_port)})
        log = self.work / "haproxy.log"
        self.process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(ROOT / "deploy/haproxy/haproxy.cfg")],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.http}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.__exit__()
                sys.exit(f"HAProxy did not become ready:\n{log.read_text()}")
            time.sleep(0.2)

    def __exit__(self, *exc):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        return False

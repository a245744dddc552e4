#!/usr/bin/env python3
"""Starts tickserve, waits until it is ready, and stops it: written once, for every
benchmark and load test.

Imported (scripts/bench/bench_batching.py, scripts/bench/bench_families.py):

    from server import Server
    with Server(config=path, log=path, taskset_cpus="0") as s:
        ...  # s.http_port, s.grpc_port, s.pid, s.ready_s

From a shell (scripts/bench/bench.sh, loadtest/run.sh): start the server, run COMMAND
once it is ready, stop the server, and exit with COMMAND's status:

    python3 scripts/bench/server.py [--config FILE] [--http-port N] [--grpc-port N] [--log FILE]
                                    [--binary PATH] [--taskset CPUS] -- COMMAND ARGS...

    python3 scripts/bench/server.py -- sh -c 'curl -s 127.0.0.1:$TICKSERVE_HTTP_PORT/v2'

The server is `BINARY serve --config FILE --http-port N --grpc-port N`, run from the
repository root (so the config's relative paths resolve as they do for
scripts/serve.sh). BINARY is --binary, else $TICKSERVE_BIN, else
target/release/tickserve; nothing here builds it. Ports left out are picked free on
loopback; the flags always override the config file's ports. COMMAND sees the ports
in $TICKSERVE_HTTP_PORT and $TICKSERVE_GRPC_PORT.

Ready means GET /v2/health/ready answers 200. If the server exits first, or is not
ready within the timeout, the start fails (ServerError; exit status 125 from the shell)
with the end of the server's log. Stopping sends SIGTERM (the server drains its queues
and answers what it admitted), waits, then kills.
"""
import argparse
import collections
import ctypes
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from bench_common import free_port

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DEFAULT_BINARY = ROOT / "target/release/tickserve"
DEFAULT_CONFIG = ROOT / "config/tickserve.toml"
# Exit status of the shell form when the server itself did not start (as env(1) and
# timeout(1) use it), so that callers can tell it from COMMAND's own failure.
START_FAILED = 125


class ServerError(RuntimeError):
    """The server did not start (its message ends with the server's log tail)."""


def binary_path(binary=None):
    """The server binary: `binary`, else $TICKSERVE_BIN, else target/release/tickserve."""
    return pathlib.Path(binary or os.environ.get("TICKSERVE_BIN") or DEFAULT_BINARY)


def log_tail(path, lines=40):
    """The last `lines` lines of the log at `path`, for error messages."""
    try:
        with open(path, errors="replace") as f:
            return "".join(collections.deque(f, maxlen=lines))
    except OSError as e:
        return f"(no log: {e})\n"


def port_in_use(port):
    """Whether something listens on loopback port `port` (with SO_REUSEADDR, as the
    server binds, so a port left in TIME_WAIT counts as free)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _stop_with_parent():
    """Runs in the server's process before exec: asks Linux to send it SIGTERM when
    the process that started it dies, so that a benchmark killed before its `with`
    block could stop the server (SIGKILL, an unhandled SIGTERM) leaves none behind.
    Survives taskset's exec."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: stop() is then the only way


class Server:
    """One tickserve process, from `with` (started and ready) to the block's end (stopped).

    config: the server configuration file (default config/tickserve.toml).
    http_port, grpc_port: the ports (None: a free port each).
    binary: the server binary (default: $TICKSERVE_BIN, else target/release/tickserve).
    log: where the server's stdout and stderr go (None: a temporary file, removed after).
    taskset_cpus: pin the server to these cores (a taskset list, e.g. "0" or "0-3").
    env: variables added to this process's environment for the server (e.g. RUST_LOG).
    args: more `tickserve serve` arguments (e.g. ["--model-control-mode", "poll"]).
    ready_timeout, stop_timeout: seconds to wait for readiness, and for SIGTERM to stop it.

    Once entered: `http_port`, `grpc_port`, `pid` (the server's own pid, also when
    pinned: taskset execs it), `process` (the Popen), `log` (its path) and `ready_s`
    (seconds from starting the process to the first 200 from /v2/health/ready).
    """

    def __init__(self, config=DEFAULT_CONFIG, http_port=None, grpc_port=None, binary=None,
                 log=None, taskset_cpus=None, env=None, ready_timeout=120.0, stop_timeout=30.0,
                 args=()):
        # Absolute, so that paths relative to the caller's directory survive the
        # server's start in the repository root.
        self.config = pathlib.Path(config).resolve()
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.binary = binary_path(binary).resolve()
        self.log = pathlib.Path(log) if log else None
        self.taskset_cpus = taskset_cpus
        self.env = env or {}
        self.args = [str(a) for a in args]
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.process = None
        self.pid = None
        self.ready_s = None
        self._temporary_log = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        """Starts the server and waits until it is ready; ServerError if it is not."""
        if not self.binary.exists():
            raise ServerError(f"{self.binary} does not exist: build it "
                              "(cargo build --release -p tickserve-server) or set TICKSERVE_BIN")
        for port in (self.http_port, self.grpc_port):
            if port is not None and port_in_use(port):
                raise ServerError(f"port {port} on 127.0.0.1 is already in use")
        self.http_port = self.http_port or free_port()
        self.grpc_port = self.grpc_port or free_port()
        if self.log is None:
            fd, name = tempfile.mkstemp(prefix="tickserve-", suffix=".log")
            os.close(fd)
            self.log, self._temporary_log = pathlib.Path(name), True
        command = (["taskset", "-c", self.taskset_cpus] if self.taskset_cpus else []) + [
            str(self.binary), "serve", "--config", str(self.config),
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), *self.args]
        with open(self.log, "w") as log:
            started = time.monotonic()
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=ROOT,
                                            env={**os.environ, **self.env},
                                            preexec_fn=_stop_with_parent)
        self.pid = self.process.pid
        url = f"http://127.0.0.1:{self.http_port}/v2/health/ready"
        while True:
            if self.process.poll() is not None:
                self._fail(f"exited with status {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass  # not listening yet, or 503 while loading
            if time.monotonic() - started > self.ready_timeout:
                self._fail(f"was not ready within {self.ready_timeout:g} s")
            time.sleep(0.01)
        self.ready_s = time.monotonic() - started
        return self

    def _fail(self, what):
        tail = log_tail(self.log)
        self.stop()
        raise ServerError(f"tickserve ({' '.join(self.process.args)}) {what}; "
                          f"the end of its log ({self.log}):\n{tail}")

    def stop(self):
        """Stops the server: SIGTERM, up to `stop_timeout` s to drain, then SIGKILL.
        Safe to call twice, or on a server that has already exited."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                print(f"tickserve did not stop within {self.stop_timeout:g} s of SIGTERM; killing it",
                      file=sys.stderr)
                self.process.kill()
                self.process.wait()
        if self._temporary_log:
            self.log.unlink(missing_ok=True)
            self._temporary_log = False


def main(argv):
    if "--" not in argv:
        if "-h" in argv or "--help" in argv:
            print(__doc__)
            return 0
        print("usage: scripts/bench/server.py [options] -- COMMAND ARGS... (--help for options)",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    command = argv[split + 1:]
    p = argparse.ArgumentParser(usage="scripts/bench/server.py [options] -- COMMAND ARGS...",
                                description="Start tickserve, wait until it is ready, run COMMAND, "
                                            "stop tickserve; exit with COMMAND's status.")
    p.add_argument("--binary", help="the server binary (default: $TICKSERVE_BIN, else target/release/tickserve)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="default: config/tickserve.toml")
    p.add_argument("--http-port", type=int, help="default: a free port")
    p.add_argument("--grpc-port", type=int, help="default: a free port")
    p.add_argument("--log", help="the server's output (default: a temporary file, removed after)")
    p.add_argument("--taskset", metavar="CPUS", help="pin the server to these cores (taskset -c CPUS)")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds (default 120)")
    args = p.parse_args(argv[:split])
    if not command:
        p.error("no COMMAND after --")
    # A SIGTERM to this helper stops the server too (the `with` block unwinds).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    server = Server(config=args.config, http_port=args.http_port, grpc_port=args.grpc_port,
                    binary=args.binary, log=args.log, taskset_cpus=args.taskset,
                    ready_timeout=args.ready_timeout)
    try:
        with server:
            env = {**os.environ, "TICKSERVE_HTTP_PORT": str(server.http_port),
                   "TICKSERVE_GRPC_PORT": str(server.grpc_port)}
            status = subprocess.call(command, env=env)
            if server.process.poll() is not None:
                print(f"scripts/bench/server.py: tickserve exited with status {server.process.returncode} "
                      f"while {command[0]} ran; the end of its log ({server.log}):\n{log_tail(server.log)}",
                      file=sys.stderr)
    except ServerError as e:
        print(f"scripts/bench/server.py: {e}", file=sys.stderr)
        return START_FAILED
    return status if status >= 0 else 128 - status  # killed by a signal: 128 + its number


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

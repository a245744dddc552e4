"""Helpers the benchmark scripts share: free ports, reading tickserve's /metrics, and CPU time."""
import os
import pathlib
import re
import resource
import socket
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    """GET `url`: (status, body text)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def metric_sum(http, name, labels=""):
    """The sum of metric `name` over its series whose labels contain `labels`
    (e.g. 'model="alpha_mlp"'), from the server's /metrics on port `http`."""
    _, text = get(f"http://127.0.0.1:{http}/metrics")
    pattern = rf"^{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$"
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


def cpu_seconds(pid):
    """CPU seconds (user + system) process `pid` has used, from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu():
    """CPU seconds this process's finished children have used (their rusage)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bytes_read(pid):
    """Bytes process `pid` has read through system calls so far (`rchar` in
    /proc/PID/io): for a server in steady state, the requests as they came off its
    sockets, framing included."""
    for line in pathlib.Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0

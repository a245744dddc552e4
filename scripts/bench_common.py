"""Helpers the benchmark scripts share: free ports, and reading tickserve's /metrics."""
import re
import socket
import urllib.request


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

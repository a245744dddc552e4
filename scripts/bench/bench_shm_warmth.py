#!/usr/bin/env python3
"""Where a sparse shared-memory request's time goes: the first request after a pause
against the one right after it.

    python3 scripts/bench/server.py --config CONFIG -- .venv/bin/python scripts/bench/bench_shm_warmth.py

with CONFIG's `[shm] enabled = true, spin = "20ms"` (the front end never sleeps). Every
10 ms (the client spins in between, so neither side sleeps) it sends two one-row
`alpha_mlp` requests back to back through the Python client and reports p50 / p99 of
each: the difference is what a pause costs beyond the transport (caches, TLB and branch
predictors gone cold), since both requests take the same path.
"""
import time

import numpy as np
from tickserve_client import ShmClient

client = ShmClient()
x = np.random.default_rng(0).random((1, 50), dtype=np.float32)
for _ in range(500):
    client.infer("alpha_mlp", {"features": x})
first, second = [], []
for _ in range(800):
    until = time.perf_counter() + 0.01
    while time.perf_counter() < until:
        pass
    t0 = time.perf_counter_ns()
    client.infer("alpha_mlp", {"features": x})
    t1 = time.perf_counter_ns()
    client.infer("alpha_mlp", {"features": x})
    t2 = time.perf_counter_ns()
    first.append(t1 - t0)
    second.append(t2 - t1)
first.sort()
second.sort()
q = lambda v, p: v[int(p * len(v))] / 1000  # noqa: E731
print(f"first after 10 ms: p50 {q(first, 0.5):.1f} us, p99 {q(first, 0.99):.1f} us; "
      f"the next one: p50 {q(second, 0.5):.1f} us, p99 {q(second, 0.99):.1f} us")

#!/usr/bin/env python3
"""The structure rules CI keeps, read from the `use` lines (and every other
`crate::` or `super::` path) of each crate's modules:

1. No import circle between the module files of any crate. A folder module
   holds its files: it reaches each of them (so `a` -> `b` -> `a/c` -> `a` is a
   circle), and a file's uses of the folder modules it is in are not counted.
2. In tickserve-server, no front end imports another (`http`, `grpc`,
   `tfserving`, `shm`), and what reads the wire (`transport/`) imports no
   front end and no port: front ends call the edge, ports put front ends
   together.
3. The edge (`crates/tickserve-edge`, the one request path) knows no wire:
   `cargo tree -p tickserve-edge -e normal` names no HTTP, gRPC or
   shared-memory crate, and prost only below tickserve-onnx (the runtime's
   reader of ONNX model files).
4. The clock bans of clippy.toml are opted out of per function, with a
   reason; a whole file (`#![allow(clippy::disallowed_methods)]`) only where
   every item is about time: the files in CLOCK_FILES.

Prints each break and exits 1 when there is one: `python3 scripts/dev/check_layers.py`.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
FRONT_ENDS = ("http", "grpc", "tfserving", "shm")
WIRE_CRATES = ("axum", "hyper", "hyper-util", "tonic", "prost", "http", "http-body", "h2",
               "tower", "iceoryx2", "tickserve-proto", "tickserve-shm-protocol")
# Files whose every item is about time: benchmarks, the latency example, the
# roots of test binaries that wait on servers, and the timing tests of the
# batcher and the executor's worker.
CLOCK_FILES = {
    "crates/tickserve-bench/src/main.rs",
    "crates/tickserve-client/examples/latency.rs",
    "crates/tickserve-engine-cuda/benches/graph_replay.rs",
    "crates/tickserve-runtime/benches/batching.rs",
    "crates/tickserve-runtime/src/batcher/tests.rs",
    "crates/tickserve-runtime/src/worker/tests.rs",
    "crates/tickserve-runtime/tests/runtime/main.rs",
    "crates/tickserve-server/tests/server/main.rs",
}


def whole_file_clock_opt_outs():
    """Files that opt out of the clock bans whole, outside CLOCK_FILES."""
    found = []
    for path in sorted((ROOT / "crates").rglob("*.rs")):
        rel = path.relative_to(ROOT).as_posix()
        if "/target/" in rel or rel in CLOCK_FILES:
            continue
        if "#![allow(clippy::disallowed_methods)]" in path.read_text():
            found.append(f"{rel}: opts out of the clock bans as a whole file (allow it per function, with a reason)")
    return found


def modules(src):
    """Module name (`edge/routes`, `http` for http/mod.rs) -> file, lib.rs and main.rs left out."""
    found = {}
    for path in src.rglob("*.rs"):
        name = path.relative_to(src).with_suffix("").as_posix()
        name = name[: -len("/mod")] if name.endswith("/mod") else name
        if name not in ("lib", "main"):
            found[name] = path
    return found


def uses(name, path, mods):
    """The modules of this crate that module `name` names."""
    text = re.sub(r"//[^\n]*", "", path.read_text())
    paths = [p.split("::") for p in re.findall(r"crate::((?:\w+::)*\w+)", text)]
    for prefix, group in re.findall(r"crate::((?:\w+::)*)\{([^}]*)\}", text):
        for item in re.findall(r"(?:^|,)\s*((?:\w+::)*\w+)", group):
            paths.append((prefix + item).split("::"))
    parent = name.split("/")[:-1]
    paths += [parent + s.split("::") for s in re.findall(r"super::((?:\w+::)*\w+)", text)]
    named = set()
    for segments in paths:
        for k in range(len(segments), 0, -1):
            target = "/".join(segments[:k])
            if target in mods:
                related = target == name or name.startswith(target + "/") or target.startswith(name + "/")
                if not related:
                    named.add(target)
                break
    return named


def circles(edges):
    """Strongly connected groups of two or more modules (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def top(name):
    return name.split("/")[0]


def wire_in_edge():
    """The wire crates the edge depends on, directly or not (rule 3). prost
    is allowed only below tickserve-onnx, which reads ONNX model files
    (protobuf) for the runtime: no request's bytes reach it."""
    def tree(*args):
        out = subprocess.run(
            ["cargo", "tree", "-p", "tickserve-edge", "-e", "normal", "--prefix", "none",
             "--locked", *args], cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
    try:
        names = tree()
        broken = []
        for name in sorted(names & set(WIRE_CRATES)):
            users = tree("-i", name, "--depth", "1") - {name}
            if name == "prost" and users <= {"tickserve-onnx"}:
                continue
            broken.append(f"tickserve-edge: depends on the wire crate {name} (through {', '.join(sorted(users))})")
        return broken
    except RuntimeError as e:
        return [f"tickserve-edge: cargo tree failed: {e}"]


def main():
    broken = []
    for crate in sorted((ROOT / "crates").iterdir()):
        src = crate / "src"
        if not src.is_dir():
            continue
        mods = modules(src)
        edges = {m: uses(m, p, mods) for m, p in mods.items()}
        for m in mods:
            folder = "/".join(m.split("/")[:-1])
            if folder in mods:
                edges[folder].add(m)
        for group in circles(edges):
            broken.append(f"{crate.name}: import circle: {' <-> '.join(group)}")
        if crate.name != "tickserve-server":
            continue
        for m, targets in sorted(edges.items()):
            for t in sorted(targets):
                if top(m) in FRONT_ENDS and top(t) in FRONT_ENDS and top(m) != top(t):
                    broken.append(f"{crate.name}: front end {top(m)} imports front end {top(t)} ({m} -> {t})")
                if top(m) == "transport" and top(t) in FRONT_ENDS + ("ports",):
                    broken.append(f"{crate.name}: the transport imports {top(t)} ({m} -> {t})")
    broken += wire_in_edge()
    broken += whole_file_clock_opt_outs()
    for line in broken:
        print(line)
    print(f"{len(broken)} breaks of the structure rules")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

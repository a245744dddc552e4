#!/usr/bin/env python3
"""What TLS costs, in one run: perf_analyzer over gRPC on alpha_mlp (one row per
request) at concurrency 1 and 8, plain text against TLS (and mutual TLS), the server
pinned to one core and perf_analyzer to another, the settings taking turns round by
round so that the machine's drift falls on all alike. The certificates (a CA, a server
certificate for localhost, a client certificate) are made here with openssl. Prints
each round and a Markdown table of medians with the ratios to plain text.

    cargo build --release -p tickserve-server
    python3 scripts/bench/bench_tls.py            # 3 rounds of 4 s windows: about 4 minutes
"""
import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_ab import PERF_ANALYZER, measure  # noqa: E402
from server import DEFAULT_CONFIG, Server  # noqa: E402


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def certificates(work):
    """ca.pem, server.pem/.key (localhost, 127.0.0.1), client.pem/.key, in `work`."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench CA", cwd=work)
    for name, usage in [("server", "serverAuth"), ("client", "clientAuth")]:
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=work)
        (work / f"{name}.ext").write_text(
            f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                "-extfile", f"{name}.ext", cwd=work)


def config(work, mode):
    """A tickserve.toml: the sample config, plus TLS for `tls` and `mtls`."""
    text = pathlib.Path(DEFAULT_CONFIG).read_text()
    if mode != "plain":
        text += (f'\n[security.tls]\ncert_file = "{work}/server.pem"\n'
                 f'key_file = "{work}/server.key"\nfront_ends = ["grpc"]\n')
        if mode == "mtls":
            text += f'client_ca_file = "{work}/ca.pem"\n'
    path = work / f"tickserve-{mode}.toml"
    path.write_text(text)
    return path


def flags(work, mode):
    if mode == "plain":
        return []
    extra = ["--ssl-grpc-use-ssl", f"--ssl-grpc-root-certifications-file={work}/ca.pem"]
    if mode == "mtls":
        extra += [f"--ssl-grpc-private-key-file={work}/client.key",
                  f"--ssl-grpc-certificate-chain-file={work}/client.pem"]
    return extra


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=4000, help="measurement window, ms")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--modes", default="plain,tls,mtls")
    args = p.parse_args()
    if not PERF_ANALYZER.exists():
        sys.exit(f"perf_analyzer wrapper not found at {PERF_ANALYZER}")
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    results = {(m, c): [] for m in modes for c in levels}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        certificates(work)
        for round_ in range(1, args.rounds + 1):
            order = modes if round_ % 2 else list(reversed(modes))
            for mode in order:
                with Server(config=config(work, mode), taskset_cpus=args.server_cpus) as server:
                    for c in levels:
                        r = measure(server.grpc_port, c, args.client_cpus, args.interval,
                                    host="localhost", extra=flags(work, mode))
                        results[(mode, c)].append(r)
                        print(f"round {round_} {mode} c{c}: {r[0]:.0f} req/s, "
                              f"p50 {r[1]:.0f} µs, p99 {r[2]:.0f} µs", flush=True)
    print()
    print(f"medians of {args.rounds} rounds, {args.interval} ms windows, server on cpus "
          f"{args.server_cpus}, perf_analyzer on cpus {args.client_cpus}")
    print()
    print("| concurrency | transport | requests/s | p50 (µs) | p99 (µs) |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for c in levels:
        med = {m: [statistics.median(x[i] for x in results[(m, c)]) for i in range(3)]
               for m in modes}
        for m in modes:
            rps, p50, p99 = med[m]
            print(f"| {c} | {m} | {rps:.0f} | {p50:.0f} | {p99:.0f} |")
        if "plain" in med:
            for m in modes:
                if m == "plain":
                    continue
                ratio = [n / o if o else float("nan") for n, o in zip(med[m], med["plain"])]
                print(f"| {c} | {m}/plain | {ratio[0]:.2f} | {ratio[1]:.2f} | {ratio[2]:.2f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""TLS with Triton's official Python clients against a running tickserve whose
front ends speak TLS (the certificates are made by crates/tickserve-server/tests/server/front_ends/tls.rs).

    python crates/tickserve-server/tests/python/tls_check.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 \
        --ca ca.pem [--client-cert client.pem --client-key client.key] [--restricted KEY]

Checks, over HTTP (`ssl=True`) and gRPC (`ssl=True`): server readiness and one
alpha_mlp inference through a client trusting the test CA; with --client-cert,
mutual TLS: a client without a certificate is refused and one with it is
served; with --restricted, inference needs the key (Triton's header over HTTP,
`triton-grpc-protocol-` metadata over gRPC) and is refused without it.
"""
import argparse
import sys

import gevent.ssl
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def localhost(address):
    """The address with the host the certificate names."""
    return "localhost:" + address.rsplit(":", 1)[1]


def http_client(args, with_cert):
    options = {"ca_certs": args.ca}
    if with_cert:
        options.update(certfile=args.client_cert, keyfile=args.client_key)
    return httpclient.InferenceServerClient(
        localhost(args.http), ssl=True, ssl_options=options,
        ssl_context_factory=gevent.ssl.create_default_context, insecure=False)


def grpc_client(args, with_cert):
    if with_cert:
        return grpcclient.InferenceServerClient(
            localhost(args.grpc), ssl=True, root_certificates=args.ca,
            private_key=args.client_key, certificate_chain=args.client_cert)
    return grpcclient.InferenceServerClient(localhost(args.grpc), ssl=True, root_certificates=args.ca)


def infer(client, module, headers=None):
    x = np.full((1, 50), 0.5, dtype=np.float32)
    tensor = module.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("alpha_mlp", [tensor], headers=headers)
    return result.as_numpy(result.get_response()["outputs"][0]["name"]
                           if module is httpclient else result.get_response().outputs[0].name)


def refused(call, what):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the refusal's form depends on the client
        print(f"  {what}: refused ({type(e).__name__})")
        return
    raise AssertionError(f"{what}: served, expected a refusal")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--client-cert")
    p.add_argument("--client-key")
    p.add_argument("--restricted")
    args = p.parse_args()
    mutual = args.client_cert is not None
    for name, module, make in [("HTTP", httpclient, http_client), ("gRPC", grpcclient, grpc_client)]:
        client = make(args, with_cert=mutual)
        assert client.is_server_ready(), f"{name}: not ready over TLS"
        headers = None
        if args.restricted:
            key = ("admin-key" if module is httpclient else "triton-grpc-protocol-admin-key")
            refused(lambda: infer(client, module), f"{name} inference without the key")
            headers = {key: args.restricted}
        out = infer(client, module, headers)
        assert out.shape[0] == 1, out.shape
        print(f"{name}: served over TLS{' (mutual)' if mutual else ''}")
        if mutual:
            bare = make(args, with_cert=False)
            refused(lambda: bare.is_server_ready(), f"{name} without a client certificate")
    print("done")


if __name__ == "__main__":
    sys.exit(main())

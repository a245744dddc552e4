#!/usr/bin/env python3
"""Validates every manifest under deploy/: Kubernetes resources against the
Kubernetes OpenAPI schemas (kubernetes-validate, from PyPI, strict: unknown fields
fail), the kustomize output of every overlay (`kubectl kustomize`) likewise,
KServe's and the Prometheus operator's resources against deploy/kserve/schema.json
(their fields as KServe's API reference documents them), Istio's against
deploy/istio/schema.json (likewise, from Istio's API reference), and the Envoy
configuration against Envoy's own API (its protobuf definitions, from the xds-protos
package: an unknown field or a wrong type fails). Run by scripts/test.sh.

    .venv/bin/python deploy/validate.py [--kubernetes-version 1.31.0]
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
CUSTOM_GROUPS = ("serving.kserve.io/", "monitoring.coreos.com/")
ISTIO_GROUP = "networking.istio.io/"


def envoy_problem(path):
    """Why the Envoy bootstrap at `path` is not valid Envoy configuration, or None."""
    from google.protobuf import json_format
    # Envoy's protos import a package named `validate`, which this file's name would
    # shadow: look for modules elsewhere than this file's folder.
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != DEPLOY]
    # Every typed_config the file names must be registered: import its module.
    from envoy.config.bootstrap.v3 import bootstrap_pb2
    from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
    from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
        http_connection_manager_pb2)
    from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2  # noqa: F401
    from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
    try:
        json_format.ParseDict(yaml.safe_load(path.read_text()), bootstrap_pb2.Bootstrap())
    except json_format.ParseError as e:
        return str(e)
    return None


def documents(text):
    return [d for d in yaml.safe_load_all(text) if d]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubernetes-version", default="1.31.0")
    args = p.parse_args()
    custom = jsonschema.Draft202012Validator(json.loads((DEPLOY / "kserve/schema.json").read_text()))
    istio = jsonschema.Draft202012Validator(json.loads((DEPLOY / "istio/schema.json").read_text()))
    sources = []
    for path in sorted((DEPLOY / "kubernetes").rglob("*.yaml")) + sorted((DEPLOY / "kserve").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        sources.append((str(path.relative_to(DEPLOY.parent)), path.read_text()))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("WARNING: no kubectl here: the kustomize overlays are not rendered, only the "
              "files themselves are validated (install kubectl to check the overlays)")
    for overlay in sorted((DEPLOY / "kubernetes/overlays").iterdir()) if kubectl else []:
        rendered = subprocess.run([kubectl, "kustomize", str(overlay)], check=True,
                                  capture_output=True, text=True).stdout
        sources.append((f"kubectl kustomize {overlay.relative_to(DEPLOY.parent)}", rendered))
    failures, checked = 0, 0
    for where, text in sources:
        for doc in documents(text):
            kind = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            checked += 1
            api = str(doc.get("apiVersion", ""))
            if api.startswith(CUSTOM_GROUPS) or api.startswith(ISTIO_GROUP):
                schema = istio if api.startswith(ISTIO_GROUP) else custom
                errors = sorted(schema.iter_errors(doc), key=lambda e: e.path)
                problem = "; ".join(e.message for e in errors[:3]) if errors else None
            else:
                try:
                    kubernetes_validate.validate(doc, args.kubernetes_version, strict=True)
                    problem = None
                except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
                        kubernetes_validate.InvalidSchemaError) as e:
                    problem = str(getattr(e, "message", e))
            if problem:
                failures += 1
                print(f"FAIL {where}: {kind}: {problem}")
            else:
                print(f"ok   {where}: {kind}")
    for path in sorted((DEPLOY / "envoy").glob("*.yaml")):
        checked += 1
        problem = envoy_problem(path)
        where = str(path.relative_to(DEPLOY.parent))
        if problem:
            failures += 1
            print(f"FAIL {where}: Envoy bootstrap: {problem}")
        else:
            print(f"ok   {where}: Envoy bootstrap")
    print(f"{checked} resources, {failures} invalid (Kubernetes {args.kubernetes_version})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

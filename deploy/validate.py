#!/usr/bin/env python3
"""Validates every manifest under deploy/: Kubernetes resources against the
Kubernetes OpenAPI schemas (kubernetes-validate, from PyPI, strict: unknown fields
fail), the kustomize output of both overlays (`kubectl kustomize`) likewise, and
KServe's and the Prometheus operator's resources against deploy/kserve/schema.json
(their fields as KServe's API reference documents them). Run by scripts/test.sh.

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


def documents(text):
    return [d for d in yaml.safe_load_all(text) if d]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubernetes-version", default="1.31.0")
    args = p.parse_args()
    custom = jsonschema.Draft202012Validator(json.loads((DEPLOY / "kserve/schema.json").read_text()))
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
            if str(doc.get("apiVersion", "")).startswith(CUSTOM_GROUPS):
                errors = sorted(custom.iter_errors(doc), key=lambda e: e.path)
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
    print(f"{checked} resources, {failures} invalid (Kubernetes {args.kubernetes_version})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

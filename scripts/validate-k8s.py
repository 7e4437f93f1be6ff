#!/usr/bin/env python3
"""Offline validation of the Kubernetes manifests in deploy/k8s/base (CI runs it).

Checks that kustomization.yaml lists exactly the manifest files of its directory, then validates
every resource of those files against the Kubernetes OpenAPI schemas that the PyPI package
`kubernetes-validate` ships (no download), strictly (unknown fields are errors), for the oldest
and the newest Kubernetes version given below. Custom resources (API groups outside
Kubernetes itself, such as KEDA's keda.sh) have no schema there: they are skipped and listed.

usage: scripts/validate-k8s.py [DIR]   (default deploy/k8s/base)
"""

import os
import sys

import kubernetes_validate
import yaml

# Oldest Kubernetes the manifests support (HPA autoscaling/v2, PDB policy/v1 and
# topologySpreadConstraints are all GA well before it) and the newest the package knows.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def is_core(api_version: str) -> bool:
    """Whether the API group belongs to Kubernetes itself (schemas available)."""
    if "/" not in api_version:
        return True  # the core group: "v1"
    group = api_version.split("/", 1)[0]
    return "." not in group or group.endswith(".k8s.io")


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "deploy/k8s/base"
    with open(os.path.join(base, "kustomization.yaml"), encoding="utf-8") as f:
        kustomization = yaml.safe_load(f)
    listed = kustomization.get("resources") or []
    present = sorted(
        name
        for name in os.listdir(base)
        if name.endswith((".yaml", ".yml")) and name != "kustomization.yaml"
    )
    errors = []
    for name in sorted(set(present) - set(listed)):
        errors.append(f"{name}: in {base} but not in kustomization.yaml resources")
    for name in sorted(set(listed) - set(present)):
        errors.append(f"{name}: in kustomization.yaml resources but not in {base}")

    validated, skipped = 0, []
    for name in listed:
        path = os.path.join(base, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        if not docs:
            errors.append(f"{name}: no resource")
        for doc in docs:
            api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
            what = f"{name}: {kind} {doc.get('metadata', {}).get('name', '?')}"
            if not is_core(api_version):
                skipped.append(f"{what} ({api_version})")
                continue
            for version in VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    path_text = ".".join(str(p) for p in e.path)
                    errors.append(f"{what}: Kubernetes {version}: {path_text}: {e.message}")
                except kubernetes_validate.SchemaNotFoundError as e:
                    errors.append(f"{what}: Kubernetes {version}: no schema: {e}")
            validated += 1

    for line in errors:
        print(f"error: {line}")
    print(
        f"validated {validated} resources of {len(listed)} files against Kubernetes "
        f"{' and '.join(VERSIONS)} (strict)"
    )
    print(f"skipped {len(skipped)} custom resources (no schema offline):")
    for line in skipped:
        print(f"  {line}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

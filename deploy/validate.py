"""Validate every manifest we ship: the Helm chart ``deploy/helm/nvmeof-csi`` rendered with its default values and
with each value set in its ``ci/`` folder, and every file under ``deploy/examples``.

Built-in kinds are checked with ``kubernetes-validate --strict`` against the schemas of the Kubernetes version
in ``versions.env``; objects of custom resources (VolumeSnapshotClass, Volcano's Job) against the
``openAPIV3Schema`` of their CRDs, fetched from the pinned Go modules (``go mod download``), strictly: a field
the schema does not name is an error, as the API server's strict field validation would say. Before it trusts
itself, the validator checks that it rejects a known-bad Deployment and a known-bad VolumeSnapshotClass. The
chart's own checks (``helm lint --strict``, its values schema refusing each file of ``deploy/helm/bad-values``,
the rendered fabric map and agent policy parsed by the driver's own parsers) are in :mod:`chart_check`.

Usage: ``python deploy/validate.py [--helm PATH]``; exit code 0 when everything is valid.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chart_check  # deploy/ is no package: this script and its helpers run from any directory
import go_fields

ROOT = Path(__file__).resolve().parent.parent


def versions() -> dict[str, str]:
    found = {}
    for line in (ROOT / "versions.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            found[key.strip()] = value.split("#", 1)[0].strip()
    return found


def go_module_dir(module: str, version: str) -> Path:
    env = dict(os.environ, GOFLAGS="-mod=mod")
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=600,
        check=False,
    )
    info = json.loads(proc.stdout or "{}")
    if proc.returncode or "Dir" not in info:
        raise SystemExit(f"validate: go mod download {module}@{version} failed: {info.get('Error') or proc.stderr}")
    return Path(info["Dir"])


def strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever it names properties (and does not preserve
    unknown fields), so an unknown field fails like the API server's strict field validation."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")


def crd_schemas(v: dict[str, str]) -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> strict object schema, for the CRDs our manifests use (ServiceMonitor: the folder of
    the operator's Go types, :mod:`go_fields`)."""
    snap = go_module_dir("github.com/kubernetes-csi/external-snapshotter/client/v8", v["EXTERNAL_SNAPSHOTTER_VERSION"])
    volcano = go_module_dir("volcano.sh/volcano", v["VOLCANO_VERSION"])
    files = [
        *sorted((snap / "config" / "crd").glob("snapshot.storage.k8s.io_*.yaml")),
        volcano / "config" / "crd" / "volcano" / "bases" / "batch.volcano.sh_jobs.yaml",
    ]
    monitoring = go_module_dir(
        "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring", v["PROMETHEUS_OPERATOR_VERSION"]
    )
    schemas: dict[tuple[str, str], Any] = {SERVICE_MONITOR: {"folder": monitoring / "v1"}}
    for path in files:
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for ver in crd["spec"]["versions"]:
            schema = copy.deepcopy(ver["schema"]["openAPIV3Schema"])
            schema.setdefault("properties", {}).update(
                apiVersion={"type": "string"}, kind={"type": "string"}, metadata={"type": "object"}
            )
            schemas[(f"{group}/{ver['name']}", kind)] = strict(schema)
    return schemas


def problems(doc: dict[str, Any], crds: dict[tuple[str, str], Any], k8s: str) -> list[str]:
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key == SERVICE_MONITOR:
        return go_fields.service_monitor_problems(doc, crds[SERVICE_MONITOR]["folder"])
    if key in crds:
        validator = jsonschema.Draft7Validator(crds[key])
        return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, k8s, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{'.'.join(map(str, err.path)) or '(root)'}: {err.message}"]
    except kubernetes_validate.utils.SchemaNotFoundError as err:
        return [f"no schema for {key[0]} {key[1]} in Kubernetes {k8s}: {err}"]
    return []


def documents(helm: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, values in chart_check.value_sets():
        for doc in chart_check.render(helm, values):
            yield f"chart[{name}]", doc
    for example in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(example.read_text()):
            if doc:
                yield f"examples/{example.name}", doc


def self_check(crds: dict[tuple[str, str], Any], k8s: str) -> None:
    bad_deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "imagee": "x"}]}}},
    }
    bad_class = {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": "x"},
        "driver": "csi.nvmeof.io",
        "deletionPolicy": "Delete",
        "drivr": "x",
    }
    bad_monitor = {
        "apiVersion": SERVICE_MONITOR[0],
        "kind": SERVICE_MONITOR[1],
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "metrics", "intervall": "5s"}]},
    }
    for doc in (bad_deployment, bad_class, bad_monitor):
        if not problems(doc, crds, k8s):
            raise SystemExit(f"validate: the validator accepted a known-bad {doc['kind']}; it cannot be trusted")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helm", default="helm", help="the helm binary")
    args = parser.parse_args()
    v = versions()
    k8s = v["KUBERNETES_VERSION"]
    crds = crd_schemas(v)
    self_check(crds, k8s)
    checked = 0
    failed = len(chart_check.check_chart(args.helm, v))
    for where, doc in documents(args.helm):
        checked += 1
        name = f"{where}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for problem in problems(doc, crds, k8s):
            failed += 1
            print(f"INVALID {name}: {problem}")
    print(f"validate: {checked} objects against Kubernetes {k8s} and {len(crds)} CRD schemas, {failed} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

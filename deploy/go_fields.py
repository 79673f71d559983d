"""Field names of Go API types, read from their source: for custom resources whose CRD YAML is not published in
a Go module the proxy serves (the Prometheus Operator's ServiceMonitor: only its ``pkg/apis/monitoring`` module
is), an object's fields are checked against the ``json`` tags of the types the operator itself decodes into.

Contract: :func:`struct_fields` returns the JSON field names of one struct type of a package folder, embedded
``,inline`` structs of the same package included; :func:`service_monitor_problems` returns one line per field of
a ServiceMonitor (spec, endpoints, selector) that the types do not name (empty: none).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.S | re.M)
FIELD = re.compile(r'^\s*(?:(\w+)\s+)?[\w.*\[\]]+\s+`json:"([^"]*)"', re.M)
META = {"apiVersion", "kind", "metadata"}
LABEL_SELECTOR = {"matchLabels", "matchExpressions"}


def structs(folder: Path) -> dict[str, str]:
    """struct name -> its body, for every non-test Go file of ``folder``."""
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.go")):
        if not path.name.endswith("_test.go"):
            found.update((m.group(1), m.group(2)) for m in STRUCT.finditer(path.read_text()))
    return found


def struct_fields(folder: Path, name: str, known: dict[str, str] | None = None) -> set[str]:
    known = known if known is not None else structs(folder)
    if name not in known:
        raise KeyError(f"no struct {name} in {folder}")
    names: set[str] = set()
    for m in FIELD.finditer(known[name]):
        tag = m.group(2).split(",")
        if tag[0]:
            names.add(tag[0])
        elif "inline" in tag[1:]:
            line = known[name][m.start() : m.end()].strip()
            embedded = line.split()[0]
            if "." not in embedded:  # metav1.TypeMeta and the like: apiVersion/kind, checked by META
                names |= struct_fields(folder, embedded, known)
    return names


def service_monitor_problems(doc: dict[str, Any], folder: Path) -> list[str]:
    known = structs(folder)
    spec_fields = struct_fields(folder, "ServiceMonitorSpec", known)
    endpoint_fields = struct_fields(folder, "Endpoint", known)
    spec = doc.get("spec") or {}
    unknown = [f"(root).{k}" for k in set(doc) - META - {"spec"}]
    unknown += [f"spec.{k}" for k in set(spec) - spec_fields]
    for i, endpoint in enumerate(spec.get("endpoints") or []):
        unknown += [f"spec.endpoints.{i}.{k}" for k in set(endpoint) - endpoint_fields]
    unknown += [f"spec.selector.{k}" for k in set(spec.get("selector") or {}) - LABEL_SELECTOR]
    return [f"{where}: not a field of the Prometheus Operator's ServiceMonitor" for where in sorted(unknown)]

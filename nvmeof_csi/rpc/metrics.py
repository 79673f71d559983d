"""RPC metrics with the names and labels the kubernetes-csi sidecars use, so their dashboards and alerts work
on our servers too: ``csi_plugin_operations_seconds{driver_name, method_name, grpc_status_code}`` (a
histogram; ``method_name`` the full gRPC method, e.g. ``/csi.v1.Controller/CreateVolume``;
``grpc_status_code`` Go's name of the code, e.g. ``OK``, ``DeadlineExceeded``). Label sets are bounded: the
methods of our services times the 17 status codes.

Contract: :class:`RpcMetrics.observe` is what the RPC edge calls once per finished call; it never raises.
:func:`serve_metrics` exposes a registry over HTTP (``/metrics``) on ``HOST:PORT``.
"""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.rpc.endpoints import parse_listen

BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600)
_GO_NAMES = {grpc.StatusCode.CANCELLED: "Canceled", grpc.StatusCode.OK: "OK"}


def go_code_name(code: grpc.StatusCode) -> str:
    """``DEADLINE_EXCEEDED`` -> ``DeadlineExceeded`` (what grpc-go's ``codes.Code.String`` says)."""
    return _GO_NAMES.get(code) or "".join(part.title() for part in code.name.split("_"))


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry, driver_name: str) -> None:
        self._driver = driver_name
        self._seconds = Histogram(
            "csi_plugin_operations_seconds",
            "Duration of RPCs served by this plugin, by method and status.",
            ("driver_name", "method_name", "grpc_status_code"),
            registry=registry,
            buckets=BUCKETS,
        )

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self._seconds.labels(self._driver, method, go_code_name(code)).observe(max(0.0, seconds))


def serve_metrics(listen: str, registry: CollectorRegistry) -> None:
    """``/metrics`` of ``registry`` on ``HOST:PORT`` (a daemon thread of prometheus-client)."""
    host, port = parse_listen(listen)
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise FailedPrecondition(f"cannot serve metrics on {listen}: {exc}") from exc

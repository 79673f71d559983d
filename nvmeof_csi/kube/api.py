"""The official Kubernetes client, made where there is a cluster: from a kubeconfig or the pod's service
account, checked at once (:func:`preflight`) and made at its first use (:class:`LazyApi`); :func:`api_error`
says what an API call raised in a few words.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def api_client(kubeconfig: str) -> Any:
    """A ``kubernetes.client.ApiClient`` from a kubeconfig path, or the pod's service account for ``""``."""
    client = importlib.import_module("kubernetes.client")  # imported only where there is a cluster
    config = importlib.import_module("kubernetes.config")
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


def preflight(kubeconfig: str) -> None:
    """What :func:`api_client` would refuse at once, found without importing the client: ``OSError`` for a
    kubeconfig that cannot be read, or, for ``""``, a pod without the API's address or its service account's
    token and CA (``ValueError``)."""
    if kubeconfig:
        with open(kubeconfig, "rb"):
            return
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")):
        raise ValueError("KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?)")
    for name in ("token", "ca.crt"):
        if not (SERVICE_ACCOUNT / name).is_file():
            raise ValueError(f"{SERVICE_ACCOUNT / name} is missing (no service account token mounted)")


class LazyApi:
    """A Kubernetes API object made by ``make`` at its first use rather than when the process starts: the
    official client's import takes 10-40 s of CPU on a small node (every model class), and a pod should serve
    before it. ``make`` runs once, under a lock, in the first user's thread; an error in it is raised to that
    user (every use site turns the client's errors into "cannot ask now") and the next use tries again."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make: Callable[[], Any] = make
        self._made: Any = None
        self._lock = threading.Lock()

    def made(self) -> Any:
        with self._lock:
            if self._made is None:
                self._made = self._make()
            return self._made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)


def lazy_api(kubeconfig: str, kind: str) -> LazyApi:
    """``kubernetes.client.<kind>`` (e.g. ``CertificatesV1Api``) on :func:`api_client`, made at its first use."""
    return LazyApi(lambda: getattr(importlib.import_module("kubernetes.client"), kind)(api_client(kubeconfig)))


def api_error(exc: Exception) -> str:
    """An API client error in a few words (its HTTP status and reason when it has them)."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    return f"HTTP {status} {reason}" if status else f"{type(exc).__name__}: {exc}"[:200]

"""The Kubernetes client is made at its first use, not at start: :class:`LazyApi` (made once, an error raised to
that user and tried again next time), :func:`preflight` (what the client would refuse at once, found without it),
and ``KubeNodes.connect`` / ``certificates_api`` leaving ``kubernetes.client`` unimported until asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvmeof_csi.cmd.identity_wiring import certificates_api
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.kube.api import LazyApi, preflight


def test_lazy_api_makes_its_object_at_first_use_once_and_retries_after_an_error() -> None:
    made: list[int] = []
    outcomes: list[Exception | None] = [RuntimeError("API not reachable yet"), None]

    def make() -> object:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        made.append(1)
        return type("Api", (), {"read_node": staticmethod(lambda name: f"node {name}")})()

    api = LazyApi(make)
    assert made == [] and len(outcomes) == 2  # nothing made before a use
    with pytest.raises(RuntimeError, match="not reachable"):
        api.read_node("gpu-1")
    assert api.read_node("gpu-1") == "node gpu-1"
    assert api.read_node("gpu-2") == "node gpu-2"
    assert made == [1]


def test_preflight_refuses_what_the_client_would_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "kubeconfig"
    with pytest.raises(OSError, match="kubeconfig"):
        preflight(str(config))
    config.write_text("apiVersion: v1\n")
    preflight(str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        preflight("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr("nvmeof_csi.kube.api.SERVICE_ACCOUNT", tmp_path / "sa")
    with pytest.raises(ValueError, match="token"):
        preflight("")
    (tmp_path / "sa").mkdir()
    for name in ("token", "ca.crt"):
        (tmp_path / "sa" / name).write_text("x")
    preflight("")
    with pytest.raises(ConfigError, match="identities"):
        certificates_api(str(tmp_path / "missing"))


def test_connecting_imports_no_kubernetes_client_until_asked(tmp_path: Path) -> None:
    """In a fresh interpreter (this one may hold the client already): the controller's fencing facts and the
    identity API are set up without ``kubernetes.client``, which comes with the first question."""
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    script = (
        "import sys\n"
        "from nvmeof_csi.kube.nodes import KubeNodes\n"
        "from nvmeof_csi.cmd.identity_wiring import certificates_api\n"
        f"nodes = KubeNodes.connect({str(config)!r}, 'd')\n"
        f"certs = certificates_api({str(config)!r})\n"
        "print('kubernetes.client' in sys.modules)\n"
        "try:\n"
        "    nodes.claimed_by('x')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
        "print('kubernetes.client' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "Unavailable", "True"], out


def test_the_controller_makes_its_client_before_it_serves(tmp_path: Path) -> None:
    """``now``: the client is made at connect (the controller, before its socket serves), and a kubeconfig that
    reads but names no cluster is refused there."""
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    script = (
        "from nvmeof_csi.kube.nodes import KubeNodes\n"
        "try:\n"
        f"    KubeNodes.connect({str(config)!r}, 'd', now=True)\n"
        "except Exception as exc:\n"
        "    print('refused', type(exc).__module__.split('.')[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["refused", "kubernetes"], out

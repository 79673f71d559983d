"""One bad certificate request cannot stop the identity signer (security round 3, #2): whatever a request makes
the parser, the check or the signing raise denies that request with the reason; a failed pass does not end the
loop; one requester's flood is capped; the signer's liveness is readiness and metrics."""

from __future__ import annotations

import base64
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.identity.certs import NODE_PREFIX, new_key, node_request, read_request
from nvmeof_csi.issuance.checks import NODE_SIGNER, Refused, check_node
from nvmeof_csi.issuance.signer import MAX_PENDING, IdentitySigner
from tests.support.csr_forge import duplicate_san_request
from tests.support.node_ca import FREE, NOW, make_ca
from tests.unit.test_node_identity import NQN1, POLICY, CsrApi, claimed, signer_of, spec


@pytest.fixture
def ca() -> tuple[bytes, bytes]:
    return make_ca(now=NOW)


def test_a_request_with_two_name_extensions_is_refused_not_raised() -> None:
    """Before, ``x509.DuplicateExtension`` escaped read_request and check_node, and the signer's thread died in
    every replica (then every identity expired within its lifetime)."""
    pem = duplicate_san_request(NODE_PREFIX + "gpu-1", NQN1, "nqn.2014-08.org.nvmexpress:uuid:victim")
    with pytest.raises(InvalidArgument, match="DuplicateExtension"):
        read_request(pem)
    with pytest.raises(Refused, match="malformed request"):
        check_node(spec(request=base64.b64encode(pem).decode()), POLICY, claimed, FREE)


def _submit(api: CsrApi, name: str, pem: bytes, node: str = "gpu-1") -> None:
    api.node = node
    api.create_certificate_signing_request(
        {
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(pem).decode(),
                "signerName": NODE_SIGNER,
                "usages": ["client auth", "digital signature"],
            },
        }
    )


def _reason(api: CsrApi, name: str) -> str:
    conditions = api.csrs[name].status.conditions
    return f"{conditions[0].type}: {conditions[0].message}" if conditions else ""


def test_the_signer_denies_the_bad_request_and_issues_the_good_one(ca: tuple[bytes, bytes]) -> None:
    api = CsrApi()
    signer = signer_of(api, ca, lambda: NOW)
    _submit(api, "a-bad", duplicate_san_request(NODE_PREFIX + "gpu-1", NQN1, NQN1))
    _submit(api, "b-good", node_request(new_key(), "gpu-1", NQN1))
    assert signer.pass_once() == {"issued": 1, "denied": 1, "left": 0}
    assert _reason(api, "a-bad").startswith("Denied: malformed request") and api.csrs["b-good"].status.certificate


def test_a_check_that_raises_anything_denies_with_the_reason(ca: tuple[bytes, bytes]) -> None:
    api = CsrApi()

    def broken(_spec: Any) -> Any:
        raise KeyError("surprise")

    signer = IdentitySigner(api, {NODE_SIGNER: broken}, ca)
    _submit(api, "odd", node_request(new_key(), "gpu-1", NQN1))
    assert signer.pass_once() == {"issued": 0, "denied": 1, "left": 0}
    assert _reason(api, "odd") == "Denied: the request could not be checked: KeyError"


def test_a_flood_from_one_requester_is_capped(ca: tuple[bytes, bytes]) -> None:
    api = CsrApi()
    signer = signer_of(api, ca, lambda: NOW)
    for i in range(MAX_PENDING + 3):
        _submit(api, f"flood-{i:02d}", node_request(new_key(), "gpu-1", NQN1))
    _submit(api, "other-node", node_request(new_key(), "gpu-2", "nqn.2014-08.org.nvmexpress:uuid:x"), node="gpu-2")
    counts = signer.pass_once()
    assert counts["issued"] == MAX_PENDING and counts["denied"] == 3 + 1  # gpu-2's asks for an NQN not its own
    assert _reason(api, f"flood-{MAX_PENDING:02d}").startswith(f"Denied: more than {MAX_PENDING} pending requests")
    assert "more than" not in _reason(api, "other-node")  # another requester is not capped by gpu-1's flood


def test_a_failing_pass_does_not_end_the_loop_and_liveness_is_readiness(ca: tuple[bytes, bytes]) -> None:
    now = [100.0]
    calls = []

    class Flaky(CsrApi):
        def list_certificate_signing_request(self, field_selector: str, **kw: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                return SimpleNamespace(items=[None])  # a malformed listing: the pass raises
            return super().list_certificate_signing_request(field_selector, **kw)

    signer = IdentitySigner(Flaky(), {NODE_SIGNER: lambda s: check_node(s, POLICY, claimed, FREE)}, ca,
                            monotonic=lambda: now[0], stale_after=60)  # fmt: skip
    assert signer.health().ready
    stop = threading.Event()
    loop = threading.Thread(target=signer.run, args=(stop, 0.01))
    loop.start()
    while len(calls) < 3:
        stop.wait(0.01)
    stop.set()
    loop.join(5)
    assert len(calls) >= 3, "the loop ended at the first failed pass"
    now[0] += 61
    assert not signer.health().ready and "no pass has ended for 61s" in signer.health().message
    registry = CollectorRegistry()
    registry.register(signer)
    assert (registry.get_sample_value("nvmeof_csi_identity_signer_passes_total") or 0) >= 2
    assert registry.get_sample_value("nvmeof_csi_identity_signer_seconds_since_pass") == 61

"""Node identities: the request a node makes, the signer's checks (each refusal for the fact that fails), the
certificate it issues, and the node's renewal — against an in-memory CSR API that records the requester the
way the API server does (user name and the token's node claim)."""

from __future__ import annotations

import base64
import datetime
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from nvmeof_csi.errors import FailedPrecondition, InvalidArgument, Unavailable
from nvmeof_csi.identity.certs import (
    expires,
    issued_by,
    make_request,
    names_of,
    new_key,
    node_identity_of,
    node_request,
    read_request,
)
from nvmeof_csi.issuance.certificate import IdentityCertificate, agent_identity, node_identity
from nvmeof_csi.issuance.checks import (
    AGENT_SIGNER,
    NODE_CLAIM,
    NODE_SIGNER,
    Policy,
    Refused,
    check_agent,
    check_node,
)
from nvmeof_csi.issuance.signer import IdentitySigner
from tests.support.node_ca import FREE, NOW, make_ca

NODE_SA = "system:serviceaccount:nvmeof-csi:nvmeof-csi-node"
NQN1 = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"
NQN2 = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000002"
CSINODES = {NQN1: ["gpu-1"], NQN2: ["gpu-2"]}
POLICY = Policy(NODE_SA, datetime.timedelta(hours=24))


class CsrApi:
    """CertificatesV1Api in memory; each create records ``user`` and ``node`` as the API server would."""

    def __init__(self) -> None:
        self.csrs: dict[str, Any] = {}
        self.user, self.node = NODE_SA, "gpu-1"

    def create_certificate_signing_request(self, body: dict[str, Any], **_: Any) -> None:
        name = body["metadata"]["name"]
        if name in self.csrs:
            raise type("Conflict", (Exception,), {"status": 409})()
        spec = body["spec"]
        self.csrs[name] = SimpleNamespace(
            metadata=SimpleNamespace(name=name),
            spec=SimpleNamespace(
                request=spec["request"], signer_name=spec["signerName"], usages=spec["usages"],
                expiration_seconds=spec.get("expirationSeconds"), username=self.user,
                extra={NODE_CLAIM: [self.node]} if self.node else {},
            ),
            status=SimpleNamespace(conditions=[], certificate=None),
        )  # fmt: skip

    def read_certificate_signing_request(self, name: str, **_: Any) -> Any:
        return self.csrs[name]

    def list_certificate_signing_request(self, field_selector: str, **_: Any) -> Any:
        signer = field_selector.removeprefix("spec.signerName=")
        return SimpleNamespace(items=[c for c in self.csrs.values() if c.spec.signer_name == signer])

    def patch_certificate_signing_request_approval(self, name: str, body: dict[str, Any], **_: Any) -> None:
        self.csrs[name].status.conditions = [SimpleNamespace(**c) for c in body["status"]["conditions"]]

    def patch_certificate_signing_request_status(self, name: str, body: dict[str, Any], **_: Any) -> None:
        self.csrs[name].status.certificate = body["status"]["certificate"]


@pytest.fixture
def ca() -> tuple[bytes, bytes]:
    return make_ca(now=NOW)


def spec(node: str = "gpu-1", nqn: str = NQN1, **over: Any) -> SimpleNamespace:
    pem = node_request(new_key(), node, nqn)
    fields = {"username": NODE_SA, "extra": {NODE_CLAIM: ["gpu-1"]}, "usages": ["client auth", "digital signature"],
              "request": base64.b64encode(pem).decode(), "expiration_seconds": None}  # fmt: skip
    return SimpleNamespace(**{**fields, **over})


def claimed(nqn: str) -> list[str]:
    return CSINODES.get(nqn, [])


AGENT_SA = "system:serviceaccount:nvmeof-csi:nvmeof-csi-agent"
#: the fabric map: agent -> (endpoint address, its Node); store-3's entry names no node
AGENTS = {"store-1": ("10.0.0.5", "storage-1"), "store-2": ("10.0.0.6", "storage-2"), "store-3": ("10.0.0.7", "")}


def signer_of(api: CsrApi, ca: tuple[bytes, bytes], clock: Any) -> IdentitySigner:
    agent_policy = Policy(AGENT_SA, datetime.timedelta(hours=24))
    checks = {
        NODE_SIGNER: lambda s: check_node(s, POLICY, claimed, FREE),
        AGENT_SIGNER: lambda s: check_agent(s, agent_policy, AGENTS.get),
    }
    return IdentitySigner(api, checks, ca, clock=clock)


def test_a_request_from_the_node_for_itself_is_issued_for_its_host_nqn(ca: tuple[bytes, bytes]) -> None:
    request, lifetime = check_node(spec(expiration_seconds=3600), POLICY, claimed, FREE)
    assert (request.common_name, request.uris, lifetime) == ("node:gpu-1", (NQN1,), datetime.timedelta(hours=1))


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"username": "system:serviceaccount:default:intruder"}, "not the node plugin"),
        ({"extra": {}}, "names no node"),
        ({"extra": {NODE_CLAIM: ["gpu-2"]}}, "runs on node 'gpu-2'"),  # gpu-2's plugin asking for gpu-1
        ({"usages": ["client auth", "server auth"]}, "client auth only"),
        ({"usages": ["digital signature"]}, "client auth only"),
        ({"request": base64.b64encode(b"not a request").decode()}, "malformed request"),
    ],
)
def test_refused_requests_name_the_fact_that_fails(changed: dict[str, Any], why: str) -> None:
    with pytest.raises(Refused, match=why):
        check_node(spec(**changed), POLICY, claimed, FREE)


def test_a_node_cannot_ask_for_another_nodes_host_nqn() -> None:
    with pytest.raises(Refused, match=r"node ID of \['gpu-2'\], not 'gpu-1'"):
        check_node(spec(nqn=NQN2), POLICY, claimed, FREE)  # gpu-1 asks for gpu-2's NQN under its own name
    with pytest.raises(Refused, match="no node"):
        check_node(spec(nqn="nqn.2014-08.org.nvmexpress:uuid:unregistered"), POLICY, claimed, FREE)
    with_ip = make_request(new_key(), "node:gpu-1", (NQN1,), ("10.0.0.9",))  # a node's name with an address
    with pytest.raises(Refused, match="no IP address"):
        check_node(spec(request=base64.b64encode(with_ip).decode()), POLICY, claimed, FREE)
    with pytest.raises(Refused, match=r"\['gpu-1', 'gpu-3'\]"):  # two nodes claim it: nobody gets it
        check_node(spec(), POLICY, lambda nqn: ["gpu-1", "gpu-3"], FREE)


def test_requests_with_other_names_or_weak_keys_are_malformed() -> None:
    def csr(key: Any, sans: list[x509.GeneralName]) -> bytes:
        b = x509.CertificateSigningRequestBuilder().subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node:gpu-1")])
        )
        b = b.add_extension(x509.SubjectAlternativeName(sans), False)
        return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ec_key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(InvalidArgument, match="DNS or e-mail"):
        read_request(csr(ec_key, [x509.UniformResourceIdentifier(NQN1), x509.DNSName("agent-1")]))
    with pytest.raises(InvalidArgument, match="EC P-256 or RSA"):
        read_request(csr(rsa.generate_private_key(65537, 1024), [x509.UniformResourceIdentifier(NQN1)]))


def test_the_signer_issues_denies_and_never_redecides(ca: tuple[bytes, bytes], tmp_path: Path) -> None:
    api = CsrApi()
    signer = signer_of(api, ca, lambda: NOW)
    node = IdentityCertificate(
        api, tmp_path / "id", NODE_SIGNER, node_identity("gpu-1", NQN1), wait=0, clock=lambda: NOW, sleep=lambda s: None
    )
    with pytest.raises(Unavailable, match="not issued within"):
        node.ensure()  # nobody signs yet
    assert signer.pass_once() == {"issued": 1, "denied": 0, "left": 0}
    assert node.ensure() is True and node.ensure() is False  # issued once, then kept
    cert = node.cert.read_bytes()
    assert issued_by(cert, ca[0]) and node_identity_of(cert) == ("gpu-1", NQN1)
    assert stat.S_IMODE(node.key.stat().st_mode) == 0o600
    api.node = "gpu-2"  # gpu-2's node plugin asks for gpu-1's identity
    intruder = IdentityCertificate(
        api, tmp_path / "x", NODE_SIGNER, node_identity("gpu-1", NQN1), wait=0, clock=lambda: NOW, sleep=lambda s: None
    )
    with pytest.raises(Unavailable):
        intruder.ensure()
    assert signer.pass_once() == {"issued": 0, "denied": 1, "left": 0}
    with pytest.raises(
        FailedPrecondition, match="denied: asks for 'node:gpu-1' but its requester runs on node 'gpu-2'"
    ):
        intruder.ensure()
    assert not intruder.cert.exists()
    assert signer.pass_once() == {"issued": 0, "denied": 0, "left": 0}  # decided requests are left alone


def test_the_node_renews_at_two_thirds_of_the_lifetime(ca: tuple[bytes, bytes], tmp_path: Path) -> None:
    api, now = CsrApi(), [NOW]
    signer = signer_of(api, ca, lambda: now[0])

    def sign(_: float) -> None:
        signer.pass_once()

    node = IdentityCertificate(
        api, tmp_path, NODE_SIGNER, node_identity("gpu-1", NQN1), datetime.timedelta(hours=3), 5, lambda: now[0], sign
    )
    assert node.ensure()
    first = node.cert.read_bytes()
    start, end = expires(first)
    assert end - NOW == datetime.timedelta(hours=3)  # the node's asked lifetime, below the signer's cap
    now[0] = start + (end - start) * 0.6
    assert node.ensure() is False
    now[0] = start + (end - start) * 0.7
    assert node.ensure() is True and node.cert.read_bytes() != first
    (tmp_path / "tls.key").unlink()  # a new key: the old certificate is not for it
    assert node.due()


def test_a_node_with_its_own_identity_reads_only_the_agents_ca_from_the_map(tmp_path: Path) -> None:
    from nvmeof_csi.agentclient.limits import AgentClients
    from nvmeof_csi.errors import ConfigError
    from nvmeof_csi.topology.fabric_map import parse_fabric_map

    ca = tmp_path / "ca.crt"
    ca.write_text("the agents' CA")
    tls = {"cert": "/tls/tls.crt", "key": "/tls/tls.key", "ca": str(ca)}  # no such cert or key on this node
    doc = {"agents": [{"name": "a", "endpoint": "tcp://10.0.0.5:9440", "fabric": "f", "tls": tls}]}
    with pytest.raises(ConfigError, match=r"tls-cert /tls/tls\.crt"):
        parse_fabric_map(doc)
    fabric = parse_fabric_map(doc, ca_only=True)
    assert (fabric.agents[0].tls, fabric.agents[0].ca) == (None, ca)
    with pytest.raises(ConfigError, match="tls ca"):
        parse_fabric_map({"agents": [{**doc["agents"][0], "tls": {**tls, "ca": "/nowhere"}}]}, ca_only=True)
    made: list[Any] = []

    def client(entry: Any) -> Any:
        made.append(entry)
        return SimpleNamespace(entry=entry)

    clients = AgentClients(fabric, client=client)
    cert, key = tmp_path / "id" / "tls.crt", tmp_path / "id" / "tls.key"
    clients.use_identity(cert, key)
    with pytest.raises(Unavailable, match="identity is not issued yet"):
        clients.for_agent("a")
    cert.parent.mkdir()
    cert.write_text("issued")
    key.write_text("mine")
    assert clients.for_agent("a") is clients.for_agent("a")  # one client per agent
    clients.reset()
    clients.for_agent("a")
    assert [(e.tls.cert, e.tls.key, e.tls.ca) for e in made] == [(cert, key, ca)] * 2


def test_a_storage_node_gets_only_the_identity_of_the_agent_it_hosts(ca: tuple[bytes, bytes], tmp_path: Path) -> None:
    api = CsrApi()
    api.user, api.node = AGENT_SA, "storage-1"
    signer = signer_of(api, ca, lambda: NOW)

    def ask(folder: str, agent: str, address: str) -> IdentityCertificate:
        cert = IdentityCertificate(
            api, tmp_path / folder, AGENT_SIGNER, agent_identity(agent, address), wait=0, sleep=lambda s: None
        )
        with pytest.raises(Unavailable):
            cert.ensure()  # created; nobody signed yet
        return cert

    mine = ask("mine", "store-1", "10.0.0.5")
    theirs = ask("theirs", "store-2", "10.0.0.6")  # store-2's name and address, asked from storage-1
    named_theirs = ask("named", "store-2", "10.0.0.5")  # store-2's name with storage-1's own address
    unknown = ask("unknown", "store-9", "10.0.0.5")
    assert signer.pass_once() == {"issued": 1, "denied": 3, "left": 0}
    unnamed = ask("unnamed", "store-3", "10.0.0.7")  # an agent whose map entry names no node: nobody gets it
    assert signer.pass_once() == {"issued": 0, "denied": 1, "left": 0}
    assert mine.ensure() is True
    assert names_of(mine.cert.read_bytes()) == ("agent:store-1", (), ("10.0.0.5",))
    assert issued_by(mine.cert.read_bytes(), ca[0]) and node_identity_of(mine.cert.read_bytes()) is None
    for cert, why in (
        # before, the check was "the address is one of the requesting Node's status.addresses", which that
        # node's kubelet writes: storage-1 adding 10.0.0.6 to its own status was issued store-2's identity
        (theirs, "agent 'store-2' runs on node 'storage-2' in the fabric map, not on the requesting node 'storage-1'"),
        (named_theirs, "asks for 10.0.0.5 but agent 'store-2' serves on 10.0.0.6"),
        (unknown, "'store-9' is not in the controller's fabric map"),
        (unnamed, "agent 'store-3' names no node in the fabric map"),
    ):
        with pytest.raises(FailedPrecondition, match=why):
            cert.ensure()
    api.user = NODE_SA  # a node plugin asking for an agent identity
    ask("by-node", "store-1", "10.0.0.5")
    assert signer.pass_once()["denied"] == 1


def test_a_node_that_asks_before_its_kubelet_registered_it_is_issued_at_its_next_try(
    ca: tuple[bytes, bytes], tmp_path: Path
) -> None:
    api, claims = CsrApi(), {NQN1: list[str]()}  # the CSINode entry is not written yet
    signer = IdentitySigner(api, {NODE_SIGNER: lambda s: check_node(s, POLICY, lambda n: claims.get(n, []), FREE)}, ca)

    def sign(_: float) -> None:
        signer.pass_once()

    node = IdentityCertificate(api, tmp_path, NODE_SIGNER, node_identity("gpu-1", NQN1), wait=5, sleep=sign)
    with pytest.raises(FailedPrecondition, match="node ID of no node"):
        node.ensure()
    claims[NQN1] = ["gpu-1"]  # kubelet registered the plugin
    assert node.ensure() is True and len(api.csrs) == 2  # a new request, not the denied one again

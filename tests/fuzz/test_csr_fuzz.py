"""Hostile certificate requests against the identity signer's parser and check: random bytes, a valid request
with bytes flipped, two name extensions, keys of other algorithms, oversized names. Each is refused with a
reason (``InvalidArgument`` from the parser, ``Refused`` from the check); nothing else ever escapes, so one
request can never stop the signer (security round 3, #2)."""

from __future__ import annotations

import base64
import contextlib
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.identity.certs import NODE_PREFIX, new_key, node_request, read_request
from nvmeof_csi.issuance.checks import Refused, check_node
from tests.support.csr_forge import duplicate_san_request
from tests.support.node_ca import FREE
from tests.unit.test_node_identity import NQN1, POLICY, claimed, spec

GOOD = serialization.load_pem_private_key(new_key(), password=None)
GOOD_DER = x509.load_pem_x509_csr(node_request(new_key(), "gpu-1", NQN1)).public_bytes(serialization.Encoding.DER)


def _refused_only(pem: bytes) -> None:
    with contextlib.suppress(InvalidArgument):  # refused with a reason is the one allowed outcome
        read_request(pem)
    with pytest.raises(Refused):  # the node plugin's own request with this body: refused, never raised
        check_node(spec(request=base64.b64encode(pem).decode()), POLICY, claimed, FREE)


def _pem(der: bytes) -> bytes:
    body = base64.encodebytes(der).decode().replace("\n", "")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return (
        "-----BEGIN CERTIFICATE REQUEST-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE REQUEST-----\n"
    ).encode()


def _request(key: Any, common_name: str, uris: list[str], hashed: bool = True) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name, _validate=False)])
    builder = x509.CertificateSigningRequestBuilder().subject_name(name)
    builder = builder.add_extension(
        x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), False
    )
    return builder.sign(key, hashes.SHA256() if hashed else None).public_bytes(serialization.Encoding.PEM)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=3000))
def test_random_bytes_are_refused(data: bytes) -> None:
    _refused_only(data)
    _refused_only(_pem(data))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(GOOD_DER) - 1), st.integers(1, 255)),
        min_size=1,
        max_size=8,
        unique_by=lambda flip: flip[0],
    )
)
def test_a_valid_request_with_flipped_bytes_is_refused(flips: list[tuple[int, int]]) -> None:
    """Each flip changes its byte (XOR with a non-zero mask, one flip per byte): setting a byte to the value it
    already held left the request valid, and the test failed on it (``flips=[(278, 0)]``)."""
    der = bytearray(GOOD_DER)
    for at, mask in flips:
        der[at] ^= mask
    assert der != GOOD_DER
    _refused_only(_pem(bytes(der)))


def test_two_name_extensions_other_keys_and_oversized_names_are_refused() -> None:
    _refused_only(duplicate_san_request(NODE_PREFIX + "gpu-1", NQN1, NQN1))
    for key, hashed in (
        (ed25519.Ed25519PrivateKey.generate(), False),
        (ed448.Ed448PrivateKey.generate(), False),
        (ec.generate_private_key(ec.SECP384R1()), True),
        (rsa.generate_private_key(65537, 1024), True),
    ):
        with pytest.raises(InvalidArgument, match="the key must be"):
            read_request(_request(key, NODE_PREFIX + "gpu-1", [NQN1], hashed))
    with pytest.raises(InvalidArgument, match="characters"):
        read_request(_request(GOOD, NODE_PREFIX + "g" * 5000, [NQN1]))
    with pytest.raises(InvalidArgument, match="at most 4 names"):
        read_request(_request(GOOD, NODE_PREFIX + "gpu-1", [f"{NQN1}{i}" for i in range(50)]))
    with pytest.raises(InvalidArgument, match="at most 4 names"):
        read_request(_request(GOOD, NODE_PREFIX + "gpu-1", [NQN1 + "x" * 10000]))
    with pytest.raises(InvalidArgument, match="bytes; at most"):
        read_request(b"-----BEGIN CERTIFICATE REQUEST-----\n" + b"A" * (1 << 20))

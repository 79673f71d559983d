"""Certificate requests that no well-behaved builder makes (the fuzz and unit tiers' hostile input): a request
with two subjectAltName extensions, re-signed so that its signature still verifies."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SAN_OID = bytes.fromhex("0603551d11")  # 2.5.29.17
STAND_IN_OID = bytes.fromhex("0603551d63")  # 2.5.29.99: the same length, replaced by SAN after building


def _length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _length(len(body)) + body


def _split(der: bytes) -> list[bytes]:
    """The TLVs inside one DER SEQUENCE, each with its header."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7F)
    parts = []
    while i < len(der):
        n, j = der[i + 1], i + 2
        if n & 0x80:
            width = n & 0x7F
            n, j = int.from_bytes(der[j : j + width], "big"), j + width
        parts.append(der[i : j + n])
        i = j + n
    return parts


def duplicate_san_request(common_name: str, first: str, second: str) -> bytes:
    """A PEM request whose two extensions are both subjectAltName (URIs ``first`` and ``second``), validly signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    stand_in = x509.UnrecognizedExtension(
        x509.ObjectIdentifier("2.5.29.99"),
        x509.SubjectAlternativeName([x509.UniformResourceIdentifier(second)]).public_bytes(),
    )
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(first)]), False)
        .add_extension(stand_in, False)
    )
    der = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)
    tbs, algorithm, _signature = _split(der)
    tbs = tbs.replace(STAND_IN_OID, SAN_OID)
    signature = key.sign(tbs, ec.ECDSA(hashes.SHA256()))
    forged = _tlv(0x30, tbs + algorithm + _tlv(0x03, b"\x00" + signature))
    return x509.load_der_x509_csr(forged).public_bytes(serialization.Encoding.PEM)

"""A node CA for tests (the CA whose key the controller's node identity signer holds), made with the same
library the driver uses, and node identities issued through the driver's own request and issue steps."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nvmeof_csi.identity.certs import Request, issue, new_key, node_request, read_request

NOW = datetime.datetime(2026, 12, 4, tzinfo=datetime.UTC)


def FREE(nqn: str, node: str, lifetime: datetime.timedelta) -> str:
    """The signer's ``bind`` hook where every host NQN is free to bind (tests of the other checks)."""
    return ""


def make_ca(name: str = "nvmeof-csi node CA", now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a self-signed CA valid a day around ``now`` (default: the real time)."""
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def node_pair(
    ca: tuple[bytes, bytes], node: str, nqn: str, common_name: str = "", now: datetime.datetime | None = None
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a node identity the node CA issued (``common_name``: forge another CN)."""
    key = new_key()
    request = read_request(node_request(key, node, nqn))
    if common_name:
        request = Request(common_name, request.uris, request.public_key)
    now = now or datetime.datetime.now(datetime.UTC)
    return issue(request, *ca, datetime.timedelta(hours=2), now), key


def write_pair(folder: Path, name: str, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    cert.write_bytes(pair[0])
    key.write_bytes(pair[1])
    key.chmod(0o600)
    return cert, key

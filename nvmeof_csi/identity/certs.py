"""Node and agent identities as X.509: what a GPU node or a storage node asks for, what the controller's signer
issues, and how an agent recognises a node (no I/O; the ``cryptography`` library does every cryptographic step).

An **agent identity** is a server certificate of the same CA with CN ``agent:<agent name>`` and exactly one IP
address name, the address the agent serves on (extended key usage serverAuth only): clients reach an agent by
that address and check it, so a storage node can serve only as the agent whose address it has.

A node identity is a client certificate issued by the **node CA** (a CA of its own, whose key only the
controller holds) with subject CN ``node:<Kubernetes node name>`` and exactly one URI subject alternative name:
the node's host NQN. It is a client certificate only (extended key usage clientAuth, not a CA). The node makes
its key itself (EC P-256, never leaves the node) and sends a PKCS#10 request (:func:`node_request`); the
signer builds the certificate from its own checked facts, never copying anything else from the request
(:func:`issue`). An agent maps a peer certificate directly issued by the node CA (:func:`issued_by`) to role
``node`` with the host NQN it names (:func:`node_identity_of`); nothing the node CA signed is ever any other
role.

Contract: :func:`read_request` raises ``InvalidArgument`` naming what is wrong with a request (not PEM, a bad
signature, a key that is not EC P-256 or RSA ≥ 2048, extensions beyond one URI); :func:`node_identity_of`
returns ``None`` for a certificate that is not a node identity in form (CN, one URI that is a host NQN).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.nqn import valid_host_nqn

NODE_PREFIX = "node:"
AGENT_PREFIX = "agent:"
#: certificates are valid from a little before they are issued: clocks of nodes and controller differ
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class Request:
    """What a checked request asks for: the CN, its URIs (a node's host NQN), its IP addresses (an agent's) and
    the public key to certify."""

    common_name: str
    uris: tuple[str, ...]
    public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey
    ips: tuple[str, ...] = ()


def new_key() -> bytes:
    """A new EC P-256 private key, PEM (PKCS#8, unencrypted: the file holding it is 0600)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


MAX_REQUEST_BYTES = 16 << 10  # an identity request is well under 2 KiB
MAX_NAMES = 4  # an identity names one host NQN or one address
MAX_NAME_CHARS = 256  # a host NQN is at most 223 bytes


def _names(uris: tuple[str, ...], ips: tuple[str, ...]) -> list[x509.GeneralName]:
    return [*map(x509.UniformResourceIdentifier, uris), *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips)]


def make_request(key_pem: bytes, common_name: str, uris: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> bytes:
    """A PKCS#10 request (PEM) for ``common_name`` with these URI and IP address names."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidArgument("an identity key must be an EC key")
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    )
    builder = builder.add_extension(x509.SubjectAlternativeName(_names(uris, ips)), False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def node_request(key_pem: bytes, node_name: str, host_nqn: str) -> bytes:
    """The request a node sends: CN ``node:<node_name>``, one URI name ``host_nqn``."""
    return make_request(key_pem, NODE_PREFIX + node_name, uris=(host_nqn,))


def read_request(pem: bytes) -> Request:
    """A PKCS#10 request checked for form (signature, key type, names); its meaning is the signer's to check.
    Whatever is wrong with it (cryptography raises its own types for hostile DER: ``DuplicateExtension``,
    ``UnsupportedGeneralNameType``, ...) is ``InvalidArgument`` naming it: a request never escapes as another error."""
    if len(pem) > MAX_REQUEST_BYTES:
        raise InvalidArgument(f"the request is {len(pem)} bytes; at most {MAX_REQUEST_BYTES} are read")
    try:
        return _read_request(pem)
    except InvalidArgument:
        raise
    except Exception as exc:  # hostile input: any of the parser's own exception types
        raise InvalidArgument(f"malformed request ({type(exc).__name__}: {exc})"[:300]) from exc


def _read_request(pem: bytes) -> Request:
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise InvalidArgument(f"not a PEM certificate request: {exc}") from exc
    if not csr.is_signature_valid:
        raise InvalidArgument("the request's signature does not verify")
    key = csr.public_key()
    if not (
        (isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1")
        or (isinstance(key, rsa.RSAPublicKey) and 2048 <= key.key_size <= 8192)
    ):
        raise InvalidArgument("the key must be EC P-256 or RSA of 2048 to 8192 bits")
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1 or len(csr.subject) != 1:
        raise InvalidArgument("the subject must be exactly one common name")
    if len(str(names[0].value)) > MAX_NAME_CHARS:
        raise InvalidArgument(f"the common name is longer than {MAX_NAME_CHARS} characters")
    uris: list[str] = []
    ips: list[str] = []
    for ext in csr.extensions:
        if not isinstance(ext.value, x509.SubjectAlternativeName):
            raise InvalidArgument(f"the request asks for extension {ext.oid.dotted_string}: only names are allowed")
        if any(not isinstance(name, x509.UniformResourceIdentifier | x509.IPAddress) for name in ext.value):
            raise InvalidArgument(
                "the request asks for a DNS or e-mail name: only URI and IP address names are allowed"
            )
        uris += ext.value.get_values_for_type(x509.UniformResourceIdentifier)
        ips += [str(ip) for ip in ext.value.get_values_for_type(x509.IPAddress)]
    if len(uris) + len(ips) > MAX_NAMES or any(len(u) > MAX_NAME_CHARS for u in uris):
        raise InvalidArgument(f"at most {MAX_NAMES} names of at most {MAX_NAME_CHARS} characters each")
    return Request(str(names[0].value), tuple(uris), key, tuple(ips))


def issue(
    request: Request,
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    lifetime: datetime.timedelta,
    now: datetime.datetime,
    server: bool = False,
) -> bytes:
    """A client certificate (``server``: a server certificate) in PEM for ``request``'s key, subject, URIs and
    IP addresses, signed by the CA."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise InvalidArgument("the node CA key must be EC or RSA")
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, request.common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(request.public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )  # digital signature only
        .add_extension(x509.SubjectAlternativeName(_names(request.uris, request.ips)), False)
    )
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def node_identity_of(cert_pem: bytes) -> tuple[str, str] | None:
    """(node name, host NQN) that a certificate names as a node identity (issuer not checked), else ``None``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    common = str(names[0].value) if len(names) == 1 else ""
    if not common.startswith(NODE_PREFIX) or len(uris) != 1 or len(list(sans)) != 1 or not valid_host_nqn(uris[0]):
        return None
    return common[len(NODE_PREFIX) :], uris[0]


def issued_by(peer_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_pem``'s key directly signed the certificate ``peer_pem`` (names, not only the signature)."""
    try:
        x509.load_pem_x509_certificate(peer_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def expires(cert_pem: bytes) -> tuple[datetime.datetime, datetime.datetime]:
    """(not before, not after) of a certificate, UTC."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def certifies(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether the certificate is for this private key."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        return False
    return bool(cert.public_key() == key.public_key())


def names_of(cert_pem: bytes) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(CN, URI names, IP address names) of a certificate; ``ValueError`` for one that is not PEM."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return (str(cns[0].value) if cns else "", (), ())
    uris = tuple(sans.get_values_for_type(x509.UniformResourceIdentifier))
    ips = tuple(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    return (str(cns[0].value) if cns else "", uris, ips)

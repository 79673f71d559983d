"""Test PKI: a CA and certificates made with the openssl CLI."""

from __future__ import annotations

from pathlib import Path

from lab.kube.pki import openssl as _openssl


def make_pki(
    folder: Path, prefix: str, clients: tuple[str, ...] = ("cli",), server_ips: tuple[str, ...] = ("127.0.0.1",)
) -> dict[str, Path]:
    """A CA, a server cert for ``server_ips`` and localhost, and client certs (CN ``<prefix>-<client>``), all from
    the openssl CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    names = ("srv", *clients)
    p = {k: folder / f"{prefix}-{k}" for k in ("ca.key", "ca.crt", "ext")}
    p.update({f"{who}.{ext}": folder / f"{prefix}-{who}.{ext}" for who in names for ext in ("key", "csr", "crt")})
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        f"/CN={prefix}-ca",
        "-keyout",
        str(p["ca.key"]),
        "-out",
        str(p["ca.crt"]),
    )
    p["ext"].write_text(f"subjectAltName={','.join(f'IP:{ip}' for ip in server_ips)},DNS:localhost\n")
    for who in names:
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={prefix}-{who}",
            "-keyout",
            str(p[f"{who}.key"]),
            "-out",
            str(p[f"{who}.csr"]),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(p[f"{who}.csr"]),
            "-CA",
            str(p["ca.crt"]),
            "-CAkey",
            str(p["ca.key"]),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(p["ext"]),
            "-out",
            str(p[f"{who}.crt"]),
        )
    return p

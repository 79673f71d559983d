"""An agent's own server identity (``--identity csr``): its certificate names the agent's one serving address,
clients check that address, and a renewed certificate written over the files serves the next handshake
without a restart (``rpc.server.bind_mtls(reload=True)``). Real gRPC TLS on loopback."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from nvmeof_csi.identity.certs import issue, make_request, new_key, read_request
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
from nvmeof_csi.rpc.server import bind_mtls
from tests.component.test_agent import free_port
from tests.support.node_ca import make_ca, node_pair, write_pair

NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"


def agent_pair(ca: tuple[bytes, bytes], address: str) -> tuple[bytes, bytes]:
    key = new_key()
    request = read_request(make_request(key, "agent:store-1", ips=(address,)))
    return issue(request, *ca, datetime.timedelta(hours=1), datetime.datetime.now(datetime.UTC), server=True), key


@pytest.fixture
def ca() -> tuple[bytes, bytes]:
    return make_ca()


@pytest.fixture
def served(tmp_path: Path, ca: tuple[bytes, bytes]) -> Iterator[tuple[int, TlsFiles]]:
    cert, key = write_pair(tmp_path / "srv", "tls", agent_pair(ca, "127.0.0.1"))
    (tmp_path / "ca.crt").write_bytes(ca[0])
    tls = TlsFiles(cert, key, tmp_path / "ca.crt")
    server = grpc.server(ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"pong")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"Ping": handler}),))
    port = free_port()
    bind_mtls(server, Endpoint.parse(f"tcp://127.0.0.1:{port}"), tls, reload=True)
    server.start()
    yield port, tls
    server.stop(None)


def ping(port: int, ca: bytes, client: tuple[bytes, bytes]) -> bytes:
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=client[1], certificate_chain=client[0])
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        answer: bytes = channel.unary_unary("/t.T/Ping", None, None)(b"ping", timeout=5)
        return answer


def test_the_address_is_checked_and_a_renewal_serves_without_restart(
    served: tuple[int, TlsFiles], ca: tuple[bytes, bytes]
) -> None:
    port, tls = served
    client = node_pair(ca, "gpu-1", NQN)
    assert ping(port, ca[0], client) == b"pong"
    # renewed for another address: the very next handshake is served with it, and the client refuses it
    other = agent_pair(ca, "127.0.0.2")
    write_pair(tls.cert.parent, "tls", other)
    with pytest.raises(grpc.RpcError) as refused:
        ping(port, ca[0], client)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    write_pair(tls.cert.parent, "tls", agent_pair(ca, "127.0.0.1"))
    assert ping(port, ca[0], client) == b"pong"


def test_a_node_identity_cannot_serve_as_an_agent(served: tuple[int, TlsFiles], ca: tuple[bytes, bytes]) -> None:
    """A GPU node's certificate (client auth only, no address) put where an agent's belongs is refused."""
    port, tls = served
    write_pair(tls.cert.parent, "tls", node_pair(ca, "gpu-1", NQN))
    with pytest.raises(grpc.RpcError):
        ping(port, ca[0], node_pair(ca, "gpu-2", NQN))

"""The Alluxio REST client's transport against a small HTTP server on loopback: status mapping, retries, the
streamed read (whole, broken off) and that a half-read connection is never reused."""

from __future__ import annotations

import json
import threading
from collections.abc import Generator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nvmeof_csi.datasets.client import AlluxioRest, CacheNotFound, CacheRequestError, CacheUnavailable

BODY = bytes(range(256)) * 4096 * 9  # 9 MiB: more than one read chunk


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: connections are reused
    calls: list[str] = []  # noqa: RUF012 - per-test server class, reset by the fixture

    def log_message(self, *args: object) -> None:
        return

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: its right
            return

    def _answer(self, code: int, body: bytes, length: int | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        sent = json.loads(self.rfile.read(size) or b"null")
        path, _, query = self.path.partition("?")
        self.calls.append(path)
        if path.endswith("/exists"):
            self._answer(200, json.dumps(sent == {}).encode())
        elif path.endswith("/gone/get-status"):
            self._answer(500, json.dumps({"message": "Path /gone does not exist"}).encode())
        elif path.endswith("/refused/mount") and query == "src=%2Fdata":
            self._answer(400, json.dumps({"message": "bad mount"}).encode())
        elif path.endswith("/flaky/get-status"):
            self._answer(503, b"busy")
        elif path.endswith("/open-file"):
            self._answer(200, b"7" if "/whole" in self.path else b"8")
        elif self.path == "/api/v1/streams/7/read":
            self._answer(200, BODY)
        elif self.path == "/api/v1/streams/8/read":  # promises more than it sends, then hangs up
            self._answer(200, BODY[:1000], length=len(BODY))
            self.close_connection = True
        elif path.endswith("/close"):
            self._answer(200, b"")
        else:
            self._answer(404, b"no such thing")


@pytest.fixture
def rest() -> Iterator[AlluxioRest]:
    Handler.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield AlluxioRest(url, url, timeout=5, attempts=2)
    finally:
        server.shutdown()
        server.server_close()


def test_answers_and_errors_are_mapped(rest: AlluxioRest) -> None:
    assert rest.exists("/datasets/a") is True
    with pytest.raises(CacheNotFound, match="does not exist"):
        rest.get_status("/gone")
    with pytest.raises(CacheRequestError, match="bad mount"):
        rest.mount("/refused", "/data")
    with pytest.raises(CacheNotFound, match="no such thing"):
        rest.unmount("/other")


def test_server_errors_are_retried_then_unavailable(rest: AlluxioRest) -> None:
    with pytest.raises(CacheUnavailable, match="503"):
        rest.get_status("/flaky")
    assert Handler.calls.count("/api/v1/paths//flaky/get-status") == 2  # attempts=2


def test_a_whole_read_returns_every_byte_and_closes_the_stream(rest: AlluxioRest) -> None:
    assert b"".join(rest.read("/whole")) == BODY
    assert Handler.calls[-1] == "/api/v1/streams/7/close"


def test_a_broken_read_is_unavailable_and_the_next_request_is_sound(rest: AlluxioRest) -> None:
    with pytest.raises(CacheUnavailable, match="broke off"):
        b"".join(rest.read("/broken"))
    assert Handler.calls[-1] == "/api/v1/streams/8/close"  # closed all the same
    assert b"".join(rest.read("/whole")) == BODY  # no half-read connection came back from the pool


def test_a_read_given_up_half_way_leaves_no_dirty_connection(rest: AlluxioRest) -> None:
    chunks = rest.read("/whole")
    assert len(next(chunks)) < len(BODY)  # the caller takes one chunk and stops
    assert isinstance(chunks, Generator)
    chunks.close()
    assert Handler.calls[-1] == "/api/v1/streams/7/close"
    assert b"".join(rest.read("/whole")) == BODY  # the unread rest of the first body is not read as this one


def test_an_unreachable_server_is_unavailable() -> None:
    with pytest.raises(CacheUnavailable, match="unreachable"):
        AlluxioRest("http://127.0.0.1:9", "http://127.0.0.1:9", timeout=1, attempts=1).exists("/x")

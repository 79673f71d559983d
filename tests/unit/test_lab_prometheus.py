"""The lab's Prometheus client asks nothing of a Prometheus that is not ready (its API answers 503 then), and a
query waits for it to be ready again instead of failing on the first 503."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lab import prometheus
from lab.vm import LabError


class FakePrometheus(BaseHTTPRequestHandler):
    """``/-/ready`` answers 503 for the first ``not_ready`` asks, then 200; the API answers 503 while not ready
    (as Prometheus does) and records every API path asked."""

    not_ready = 0
    asked: list[str] = []  # noqa: RUF012 - replaced per test by the fixture

    def do_GET(self) -> None:
        server = type(self)
        if self.path.startswith("/-/ready"):
            ready = server.not_ready <= 0
            server.not_ready -= 1
            self.send_response(200 if ready else 503)
            self.end_headers()
            return
        server.asked.append(self.path.split("?")[0])
        if server.not_ready > 0:
            self.send_response(503)
            self.end_headers()
            return
        body: dict[str, Any] = {"data": {"result": [], "alerts": []}}
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def server() -> Iterator[tuple[str, type[FakePrometheus]]]:
    handler = type("Handler", (FakePrometheus,), {"not_ready": 0, "asked": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_prometheus_that_is_not_ready_is_not_queried(server: tuple[str, type[FakePrometheus]]) -> None:
    url, handler = server
    handler.not_ready = 1
    assert prometheus._run(url, {"instant": ["up"]}) == {"ready": False}
    assert handler.asked == []  # the 503 of the API was never met
    doc = prometheus._run(url, {"instant": ["up"]})
    assert (
        doc["ready"] is True and doc["instant"] == {"up": []} and handler.asked == ["/api/v1/query", "/api/v1/alerts"]
    )


class Scripted(prometheus.Prometheus):
    """A Prometheus whose replies are scripted (the base class's waiting, without a process)."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__({"job": "127.0.0.1:1"}, "1s")
        self.replies = replies

    def _launch(self) -> None:
        return

    def _exited(self) -> bool:
        return False

    def _query(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.replies.pop(0)

    def log_tail(self) -> str:
        return "the log"

    def stop(self) -> None:
        return


def test_a_query_waits_for_ready_and_then_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.prometheus.time.sleep", lambda _: None)
    prom = Scripted([{"ready": False}, {"ready": False}, {"ready": True, "alerts": ["a"]}])
    assert prom.query()["alerts"] == ["a"] and prom.replies == []


def test_a_query_that_never_gets_ready_raises_with_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 30))
    monkeypatch.setattr("lab.prometheus.time.sleep", lambda _: None)
    monkeypatch.setattr("lab.prometheus.time.monotonic", lambda: float(next(clock)))
    prom = Scripted([{"ready": False}] * 10)
    with pytest.raises(LabError, match="did not answer ready within 60 s:\nthe log"):
        prom.query()


def test_the_test_copy_of_the_rules_changes_only_their_hold() -> None:
    import yaml

    shipped, fast = (yaml.safe_load(t) for t in (prometheus.rules_text(), prometheus.rules_text("12s")))
    rules = [
        (a, b)
        for ga, gb in zip(shipped["groups"], fast["groups"], strict=True)
        for a, b in zip(ga["rules"], gb["rules"], strict=True)
    ]
    assert rules and all(b["for"] == "12s" for _, b in rules)
    assert any(a["for"] != "12s" for a, _ in rules)
    assert all(
        {k: v for k, v in a.items() if k != "for"} == {k: v for k, v in b.items() if k != "for"} for a, b in rules
    )


class KeepAlive(BaseHTTPRequestHandler):
    """Answers every GET with its own path, keeping the connection open as Prometheus (Go) does."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


def test_pipelined_gets_on_one_connection_come_back_in_order() -> None:
    """What the guest's socat sends and gets back: one connection, every answer in the order asked."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    paths = ["/-/ready", "/api/v1/query?query=up", "/api/v1/alerts"]
    try:
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=10) as conn:
            conn.sendall(prometheus.pipelined(paths).encode())
            raw = b"".join(iter(lambda: conn.recv(65536), b""))  # the last request closes the connection
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [(status, json.loads(body)["path"]) for status, body in prometheus.responses(raw, 3)] == [
        (200, p) for p in paths
    ]


def test_responses_reads_chunked_and_sized_bodies_and_stops_where_the_answer_was_cut() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    sized = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"
    assert prometheus.responses(chunked + sized, 2) == [(200, b"hello world"), (503, b"busy")]
    assert prometheus.responses(chunked + sized[:-2], 2) == [(200, b"hello world")]  # its body cut short
    assert prometheus.responses(b"", 1) == []

"""A real Prometheus inside the lab VM, scraping the driver and the agent there, evaluating our alert rules.

Host side: :class:`GuestPrometheus` writes its configuration, starts the binary (built from its Go module by
``./dev setup``, reached through the 9p root share) and answers queries through ``socat`` in the guest (the VM
has no network card, so the HTTP API is reachable only from inside): a batch of queries is one connection of
pipelined GETs (:func:`pipelined`), its answers parsed here (:func:`responses`). :class:`HostPrometheus` is the
same on this host, on loopback, for the host tiers (the alluxio tier's dataset panels).

A batch answers ``{"ready": true, "instant": {expr: result}, "range": {expr: result}, "alerts": [...]}`` (only
``{"ready": false}`` while ``/-/ready`` does not answer 200: nothing else is asked then, or when the API answers
503 because it became busy) where a request is ``{"instant": [expr...], "range": [expr...], "start": unix,
"end": unix, "step": seconds}``.

Contract: :meth:`Prometheus.start` returns once ``/-/ready`` answers and every scrape target is up (or
raises :class:`LabError` with the log); :meth:`Prometheus.stop` ends the process.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests
import yaml

from lab.build import REPO
from lab.vm import LabError, LabVM, Pending

PORT = 9090
URL = f"http://127.0.0.1:{PORT}"
WORK = "/run/nvmeof-csi/prometheus"
RULES = REPO / "deploy" / "prometheus" / "alerts.yaml"
BINARY = REPO / "tools" / "bin" / "prometheus"


def rules_text(hold: str | None = None) -> str:
    """Our shipped alert rules; with ``hold`` (e.g. ``"12s"``) every rule's ``for:`` replaced by it, a test copy
    that fires the very same expressions without waiting minutes (promtool's unit tests in the alerts tier keep
    checking the shipped ``for:`` values)."""
    text = RULES.read_text()
    if hold is None:
        return text
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = hold
    return str(yaml.safe_dump(doc, sort_keys=False))


def config(targets: dict[str, str], interval: str, rules: Path | str = RULES) -> str:
    """A Prometheus configuration: one job per ``{job name: HOST:PORT}`` and the alert rules in ``rules``."""
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n" for job, target in targets.items()
    )
    return (
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        f"rule_files:\n  - {rules}\nscrape_configs:\n{jobs}"
    )


class Prometheus(ABC):
    """What both runs share: the configuration, waiting until every target is up, batched queries. Subclasses
    say where the process runs (:class:`GuestPrometheus`, :class:`HostPrometheus`)."""

    url = URL
    ready_wait = 60.0

    def __init__(self, targets: dict[str, str], interval: str, rules: str | None = None) -> None:
        """``rules``: the alert rules' text (default: the shipped ``deploy/prometheus/alerts.yaml``)."""
        self.targets, self.interval = dict(targets), interval
        self.rules = rules_text() if rules is None else rules

    def argv(self, work: str, listen: str) -> list[str]:
        if not BINARY.exists():
            raise LabError(f"{BINARY} is missing: run ./dev setup (it builds Prometheus from its Go module)")
        return [
            str(BINARY.resolve()),
            f"--config.file={work}/prometheus.yml",
            f"--storage.tsdb.path={work}/data",
            f"--web.listen-address={listen}",
            "--log.level=warn",
        ]

    def start(self, timeout: float = 180) -> float:
        """Start; returns the seconds until Prometheus was ready with every target up."""
        self._launch()
        begin = time.monotonic()
        while time.monotonic() - begin < timeout:
            if self._exited():
                break
            doc = self._query(self._request(instant=["up"]))
            ups = {r["metric"].get("job"): r["value"][1] for r in doc.get("instant", {}).get("up", [])}
            if doc.get("ready") and len(ups) == len(self.targets) and all(v == "1" for v in ups.values()):
                return time.monotonic() - begin
            time.sleep(2)
        raise LabError(f"Prometheus did not become ready with every target up:\n{self.log_tail()}")

    def query(
        self, instant: Sequence[str] = (), ranged: Sequence[str] = (), start: float = 0, end: float = 0, step: float = 2
    ) -> dict[str, Any]:
        """Instant and range queries in one batch, and the alerts (see the module docstring). A Prometheus that
        stopped answering ready (``/-/ready``: 503 while it is busy) is asked again for up to ``ready_wait``
        seconds; after that :class:`LabError` with its log."""
        request = self._request(instant, ranged, start, end, step)
        deadline = time.monotonic() + self.ready_wait
        while True:
            doc = self._query(request)
            if doc.get("ready"):
                return doc
            if self._exited() or time.monotonic() > deadline:
                raise LabError(f"Prometheus did not answer ready within {self.ready_wait:.0f} s:\n{self.log_tail()}")
            time.sleep(1)

    @staticmethod
    def _request(
        instant: Sequence[str] = (), ranged: Sequence[str] = (), start: float = 0, end: float = 0, step: float = 2
    ) -> dict[str, Any]:
        return {"instant": list(instant), "range": list(ranged), "start": start, "end": end, "step": step}

    @abstractmethod
    def _launch(self) -> None: ...

    @abstractmethod
    def _exited(self) -> bool: ...

    @abstractmethod
    def _query(self, request: dict[str, Any]) -> dict[str, Any]: ...

    @abstractmethod
    def log_tail(self) -> str: ...

    def now(self) -> float:
        """The clock Prometheus stamps its samples with."""
        return time.time()

    @abstractmethod
    def stop(self) -> None: ...


class GuestPrometheus(Prometheus):
    """Prometheus inside the lab VM (queries run in the guest: the VM has no network card)."""

    def __init__(self, vm: LabVM, targets: dict[str, str], interval: str = "2s", rules: str | None = None) -> None:
        super().__init__(targets, interval, rules)
        self.vm = vm
        self._pending: Pending | None = None

    def _launch(self) -> None:
        argv = self.argv(WORK, f"127.0.0.1:{PORT}")
        self.vm.run(["rm", "-rf", WORK], 30)
        self.vm.mkdir(f"{WORK}/data")
        self.vm.write(f"{WORK}/alerts.yaml", self.rules)
        self.vm.write(f"{WORK}/prometheus.yml", config(self.targets, self.interval, f"{WORK}/alerts.yaml"))
        self._pending = self.vm.submit(
            ["sh", "-c", f'echo $$ > {WORK}/pid; exec "$@" >{WORK}/log 2>&1', "prometheus", *argv], timeout=7200
        )

    def _exited(self) -> bool:
        return self._pending is None or self._pending.done()

    def log_tail(self) -> str:
        return self.vm.run(["tail", "-n", "30", f"{WORK}/log"], 10).out

    def _fetch(self, paths: list[str]) -> list[tuple[int, bytes]]:
        """``paths`` pipelined on one connection by ``socat`` in the guest (no Python start under TCG);
        ``shut-none``: the server sees no half-close, which Go's HTTP server takes for a client gone."""
        argv = ["socat", "-t", "60", "STDIO", f"TCP:127.0.0.1:{PORT},shut-none"]
        res = self.vm.submit(argv, 90, stdin=pipelined(paths)).wait()
        return responses(res.out.encode(), len(paths))

    def _query(self, request: dict[str, Any]) -> dict[str, Any]:
        return _ask(self._fetch, request)

    def now(self) -> float:
        return float(self.vm.check(["date", "+%s.%N"], timeout=30).strip())

    def stop(self) -> None:
        if self._pending is not None:
            pid = self.vm.run(["cat", f"{WORK}/pid"], 10).out.strip()
            if pid.isdigit():
                self.vm.run(["kill", "-TERM", pid], 10)
            self._pending.wait(timeout=60)
            self._pending = None


class HostPrometheus(Prometheus):
    """Prometheus on this host, listening on loopback only (scrapes loopback targets of the host tiers)."""

    def __init__(self, work: Path, targets: dict[str, str], interval: str = "1s", rules: str | None = None) -> None:
        super().__init__(targets, interval, rules)
        self.work = work
        with socket.socket() as probe:  # a free loopback port
            probe.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{probe.getsockname()[1]}"
        self._process: subprocess.Popen[bytes] | None = None

    def _launch(self) -> None:
        argv = self.argv(str(self.work), self.url.removeprefix("http://"))
        (self.work / "data").mkdir(parents=True, exist_ok=True)
        (self.work / "alerts.yaml").write_text(self.rules)
        (self.work / "prometheus.yml").write_text(config(self.targets, self.interval, self.work / "alerts.yaml"))
        with (self.work / "log").open("wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def _exited(self) -> bool:
        return self._process is None or self._process.poll() is not None

    def log_tail(self) -> str:
        return "\n".join((self.work / "log").read_text(errors="replace").splitlines()[-30:])

    def _query(self, request: dict[str, Any]) -> dict[str, Any]:
        return _run(self.url, request)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)
            self._process = None


#: ``paths -> [(HTTP status, body)]``, one per path, in order; ``[]`` when Prometheus cannot be reached
Fetch = Callable[[list[str]], list[tuple[int, bytes]]]


def http_fetch(url: str) -> Fetch:
    """Fetch over HTTP from this process (the host tiers, and the tests)."""

    def fetch(paths: list[str]) -> list[tuple[int, bytes]]:
        try:
            return [(r.status_code, r.content) for r in (requests.get(f"{url}{p}", timeout=60) for p in paths)]
        except requests.RequestException:
            return []

    return fetch


def pipelined(paths: list[str]) -> str:
    """HTTP/1.1 GETs of ``paths`` on one connection, the last one closing it."""
    last = len(paths) - 1
    return "".join(
        f"GET {p} HTTP/1.1\r\nHost: prometheus\r\nConnection: {'close' if i == last else 'keep-alive'}\r\n\r\n"
        for i, p in enumerate(paths)
    )


def responses(raw: bytes, count: int) -> list[tuple[int, bytes]]:
    """The first ``count`` HTTP responses in ``raw`` (what :func:`pipelined` was answered), fewer when cut short."""

    class Stream(io.BytesIO):
        def close(self) -> None:  # a response closes its file when read: the next one is in the same bytes
            return

    stream = Stream(raw)

    class Wire:
        def makefile(self, *_: object, **__: object) -> io.BytesIO:
            return stream

    out = []
    for _ in range(count):
        reply = http.client.HTTPResponse(Wire())  # type: ignore[arg-type]
        try:
            reply.begin()
            out.append((reply.status, reply.read()))
        except (http.client.HTTPException, OSError):
            break
    return out


def _ask(fetch: Fetch, request: dict[str, Any]) -> dict[str, Any]:
    ready = fetch(["/-/ready"])
    if not ready or ready[0][0] != 200:  # starting, or busy: its API answers 503 until it is ready again
        return {"ready": False}
    keys: list[tuple[str, str]] = []
    paths = []
    for expr in request.get("instant", []):
        keys.append(("instant", expr))
        paths.append("/api/v1/query?" + urlencode({"query": expr}))
    for expr in request.get("range", []):
        keys.append(("range", expr))
        window = {"start": request["start"], "end": request["end"], "step": request["step"]}
        paths.append("/api/v1/query_range?" + urlencode({"query": expr, **window}))
    replies = fetch([*paths, "/api/v1/alerts"])
    if len(replies) != len(paths) + 1 or any(status == 503 for status, _ in replies):
        return {"ready": False}  # became busy meanwhile: the caller asks again
    for (status, body), path in zip(replies, [*paths, "/api/v1/alerts"], strict=True):
        if status != 200:
            raise LabError(f"Prometheus answered {status} to {path}: {body[:300]!r}")
    out: dict[str, Any] = {"ready": True, "instant": {}, "range": {}}
    for (kind, expr), (_, body) in zip(keys, replies, strict=False):
        out[kind][expr] = json.loads(body)["data"]["result"]
    out["alerts"] = json.loads(replies[-1][1])["data"]["alerts"]
    return out


def _run(url: str, request: dict[str, Any]) -> dict[str, Any]:
    return _ask(http_fetch(url), request)

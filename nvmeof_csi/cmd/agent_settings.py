"""Typed settings of ``nvmeof-csi agent``, each declared once with its flag, environment variable, help, default
and range (:func:`nvmeof_csi.cmd.flags.setting`); the command's options and docs/configuration.md's agent table are made
from these declarations, and the checks here name the setting they refuse.

Nothing below ``cmd/`` imports these types or reads the environment: the wiring hands each component the
plain values it needs.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvmeof_csi.agent.configfs import CNTLID_RANGE
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.cmd.flags import REQUIRED, check_ranges, setting
from nvmeof_csi.cmd.settings import parse_size
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles, is_loopback
from nvmeof_csi.service.contracts import valid_location


def _endpoint_or_none(text: Any) -> Endpoint | None:
    return Endpoint.parse(str(text)) if text else None


def _absolute(path: Any) -> Path:
    return Path(path).absolute()


@dataclass(frozen=True)
class AgentSettings:
    """Everything ``nvmeof-csi agent`` needs; see ``nvmeof-csi agent --help``."""

    name: str = setting(REQUIRED, "The agent's name: a DNS label, part of every volume ID it serves.", env="AGENT_NAME")
    portals: tuple[PortSpec, ...] = setting(
        REQUIRED,
        "`ID:TRTYPE:TRADDR:TRSVCID[:GROUP[:tls]]`: an nvmet port (`tcp` or `rdma`), repeatable; GROUP is the "
        "portal group whose ANA state `nvmeofctl ana set` changes; `tls` makes a TCP port require TLS 1.3 and "
        "export only `tls: psk` volumes (every other port exports only clear-text volumes).",
        env="AGENT_PORTALS",
        name="portal",
        raw=(list[str], []),
        parse=lambda texts: tuple(PortSpec.parse(t) for t in texts),
        metavar="ID:TRTYPE:TRADDR:TRSVCID[:GROUP]",
    )
    state_dir: Path = setting(
        Path("/var/lib/nvmeof-csi/agent"),
        "Where the desired state is saved (durable).",
        env="AGENT_STATE_DIR",
        raw=(Path, None),
        parse=_absolute,
    )
    pool_dir: Path = setting(
        Path("/var/lib/nvmeof-csi/pool"),
        "The backing-file pool (XFS with reflink recommended).",
        env="AGENT_POOL_DIR",
        raw=(Path, None),
        parse=_absolute,
    )
    unix_endpoint: Endpoint | None = setting(
        "unix:///run/nvmeof-csi/agent.sock",
        "`unix:///path`: the owner-only local socket (`''` to disable).",
        env="AGENT_LISTEN_UNIX",
        name="listen-unix",
        parse=_endpoint_or_none,
    )
    tcp_endpoint: Endpoint | None = setting(
        "",
        "`tcp://HOST:PORT`, served with mutual TLS only; plaintext is refused unless "
        "`--allow-plaintext-loopback` on a loopback address.",
        env="AGENT_LISTEN_TCP",
        name="listen-tcp",
        parse=_endpoint_or_none,
    )
    tls_cert: Path | None = setting(None, "The server certificate (PEM).", env="AGENT_TLS_CERT")
    tls_key: Path | None = setting(None, "The server key (PEM).", env="AGENT_TLS_KEY")
    tls_ca: Path | None = setting(None, "The CA that signs accepted clients (PEM).", env="AGENT_TLS_CA")
    identity: str = setting(
        "files",
        "`csr`: the server certificate is this agent's own, asked of the controller's signer with a Kubernetes "
        "CSR (CN agent:<name>, the --listen-tcp address; key and certificate in <state-dir>/identity, renewed "
        "at 2/3 of its lifetime; needs --tls-ca and --node-name, not --tls-cert/--tls-key); `files`: --tls-*.",
        env="AGENT_IDENTITY",
    )
    node_name: str = setting("", "The Kubernetes node this agent runs on (`spec.nodeName`), for `--identity csr`.")
    kubeconfig: str = setting("", "With `--identity csr`: a kubeconfig path; empty: the pod's service account.")
    identity_hours: float = setting(24.0, "Lifetime asked for the agent's own certificate.", low=1, high=8760)
    node_ca: Path | None = setting(
        None,
        "The node CA (PEM): clients it issued are accepted as role node for the host NQN their certificate "
        "names (the controller's node identity signer), without an --authz-file entry.",
        env="AGENT_NODE_CA",
    )
    allow_plaintext_loopback: bool = setting(
        False, "Allow TCP without TLS, on a loopback address only (tests).", env=False
    )
    prune: bool = setting(
        False,
        "Remove this driver's configfs objects and pool files the state does not know "
        "(never another user's subsystem, nor a port exporting one).",
        env=False,
    )
    cntlid_window: str = setting(
        "",
        "`MIN-MAX`: the controller IDs this agent's subsystems give (1-65519); agents that expose one volume "
        "(a replicated one) need disjoint windows. Empty: nvmet's default, the whole range.",
    )
    replication_address: str = setting(
        "",
        'This storage node\'s IP address for DRBD replication to its peers (`replicas: "2"` volumes; the '
        "kernel's DRBD 8.4 and drbd-utils' drbdadm-84). Empty: replicated volumes are refused here.",
    )
    self_fence_after: float = setting(
        5.0,
        "Seconds a replica's DRBD fence-peer call may wait for the controller before every portal of the volume is "
        "unlinked here (hosts then move to the peer once the controller promotes it; below its 15 s grace).",
        low=1,
        high=60,
    )
    drbd_helper_dir: Path = setting(
        Path("/run/nvmeof-csi/drbd"),
        "A folder on the host (the kernel runs DRBD's usermode helper there, in the host's namespaces) for the "
        "helper script and the spool of its fence-peer calls.",
        env=False,
    )
    keyring_serial_file: Path | None = setting(
        None,
        "Publish the kernel's .nvme keyring serial in this file for `nvmeof-csi tlshd` in another container (the "
        "runtime hides /proc/keys from it); the chart sets it with nvmeTls.handshakeDaemon.",
        env="AGENT_KEYRING_SERIAL_FILE",
    )
    pool_high_water: float = setting(
        90.0,
        "Percent of the pool's filesystem past which creates, snapshots and clones get RESOURCE_EXHAUSTED, so that "
        "the volumes already there can still be written (100: no mark).",
        low=50,
        high=100,
    )
    capacity_limit_bytes: int = setting(
        "0",
        "Thin-provisioning limit, e.g. `10T` (`0`: the pool filesystem's size).",
        env="AGENT_CAPACITY_LIMIT",
        name="capacity-limit",
        parse=lambda text: parse_size(str(text)),
    )
    configfs_root: Path = setting(Path("/sys/kernel/config/nvmet"), "The nvmet configfs root.", env=False)
    configfs_plain_tree: bool = setting(
        False, "TESTS ONLY: configfs-root is a plain folder standing in for configfs.", env=False, hidden=True
    )
    buffered_io: bool = setting(
        False, "Use the page cache for backing files (only where O_DIRECT is impossible, e.g. tmpfs).", env=False
    )
    grace_seconds: float = setting(
        30.0, "On SIGTERM, the seconds in-flight RPCs get before they are cancelled.", low=0, high=600, low_open=True
    )
    log_level: str = setting("INFO", "`DEBUG`, `INFO`, `WARNING` or `ERROR`.")
    alluxio_proxy: str = setting("", "The Alluxio REST proxy URL (dataset volumes).")
    alluxio_job: str = setting("", "The Alluxio job master's web URL (cache load jobs).")
    metrics_listen: str = setting("", "`HOST:PORT` for Prometheus `/metrics`.")
    authz_file: Path | None = setting(
        None,
        "YAML mapping client certificate identities to roles (controller, node, "
        "admin, reader; see docs/security.md); required with `--listen-tcp`.",
        env="AGENT_AUTHZ_FILE",
    )
    dataset_ufs_allow: tuple[str, ...] = setting(
        [],
        "An under-store prefix `dataset.uri` may name (repeatable; none by default, so only data sets "
        "already in Alluxio are used).",
        env="AGENT_DATASET_UFS_ALLOW",
        raw=(list[str], []),
        parse=tuple,
        metavar="PREFIX",
    )
    dataset_root: str = setting(
        "/datasets", "The Alluxio folder every `dataset.path` must be in.", env="AGENT_DATASET_ROOT"
    )

    @property
    def tls(self) -> TlsFiles | None:
        """The server's mutual-TLS files, or ``None`` (checked together at construction; with ``--identity
        csr`` the agent makes them at start)."""
        if self.identity == "csr":
            return None
        return TlsFiles.from_options(self.tls_cert, self.tls_key, self.tls_ca)

    @property
    def mutual_tls(self) -> bool:
        return self.tls is not None or self.identity == "csr"

    def cntlid(self) -> tuple[int, int] | None:
        """``--cntlid-window`` as (min, max); ``ConfigError`` for a malformed or out-of-range window."""
        if not self.cntlid_window:
            return None
        low, _, high = self.cntlid_window.partition("-")
        if not (low.isdigit() and high.isdigit()) or not 1 <= int(low) <= int(high) <= CNTLID_RANGE[1]:
            raise ConfigError(f"--cntlid-window {self.cntlid_window!r} must be MIN-MAX within 1-{CNTLID_RANGE[1]}")
        return int(low), int(high)

    def __post_init__(self) -> None:
        check_ranges(self)
        self._check_authz()
        self._check_datasets()
        if bool(self.alluxio_proxy) != bool(self.alluxio_job):
            raise ConfigError("--alluxio-proxy and --alluxio-job go together (dataset volumes need both)")
        for url in (self.alluxio_proxy, self.alluxio_job):
            if url and not url.startswith(("http://", "https://")):
                raise ConfigError(f"Alluxio URL {url!r} must start with http:// or https://")
        self.cntlid()  # a malformed window is refused at start
        self._check_replication()
        if self.metrics_listen and ":" not in self.metrics_listen:
            raise ConfigError("--metrics-listen must be HOST:PORT")
        if not valid_location(self.name):
            raise ConfigError(f"agent name {self.name!r} must be a DNS label (it becomes part of volume IDs)")
        if not self.portals:
            raise ConfigError("at least one --portal is required (ID:TRTYPE:TRADDR:TRSVCID[:GROUP[:tls]])")
        ids = [p.port_id for p in self.portals]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"portal IDs must be unique, got {ids}")
        if self.unix_endpoint is None and self.tcp_endpoint is None:
            raise ConfigError("the agent needs --listen-unix and/or --listen-tcp")
        if self.unix_endpoint is not None and self.unix_endpoint.scheme != "unix":
            raise ConfigError("listen-unix must be a unix:///path endpoint")
        self._check_tcp()
        if self.capacity_limit_bytes < 0:
            raise ConfigError("capacity-limit must not be negative")
        for name in ("state_dir", "pool_dir", "configfs_root", "drbd_helper_dir"):
            if not getattr(self, name).is_absolute():
                raise ConfigError(f"{name.replace('_', '-')} must be an absolute path")

    def _check_replication(self) -> None:
        if self.replication_address and not _is_ip(self.replication_address):
            raise ConfigError(f"--replication-address {self.replication_address[:60]!r} must be an IP address")

    def _check_datasets(self) -> None:
        if not self.dataset_root.startswith("/") or self.dataset_root == "/" or ".." in self.dataset_root.split("/"):
            raise ConfigError(f"--dataset-root {self.dataset_root!r} must be an absolute Alluxio path other than /")
        for prefix in self.dataset_ufs_allow:
            if not prefix.strip("/") or ".." in prefix.split("/"):
                raise ConfigError(f"--dataset-ufs-allow {prefix!r} must name an under-store location (not / or ..)")

    def _check_identity(self) -> None:
        if self.identity not in ("files", "csr"):
            raise ConfigError(f"--identity {self.identity!r} must be files or csr")
        if self.identity == "csr" and (
            self.tcp_endpoint is None or self.tls_ca is None or self.tls_cert or self.tls_key or not self.node_name
        ):
            raise ConfigError(
                "--identity csr needs --listen-tcp, --tls-ca and --node-name, and no --tls-cert/--tls-key"
            )

    def _check_authz(self) -> None:
        self._check_identity()
        if self.mutual_tls and self.tcp_endpoint is not None and self.authz_file is None:
            raise ConfigError("--listen-tcp with mutual TLS needs --authz-file (which client identity has which role)")
        if self.authz_file is not None and not self.authz_file.is_file():
            raise ConfigError(f"--authz-file {self.authz_file} is not a readable file")
        if self.node_ca is not None and (not self.mutual_tls or not self.node_ca.is_file()):
            raise ConfigError(f"--node-ca {self.node_ca} must be a readable file, and it needs mutual TLS (--tls-*)")

    def _check_tcp(self) -> None:
        if self.tcp_endpoint is None:
            return
        if self.tcp_endpoint.scheme != "tcp":
            raise ConfigError("listen-tcp must be a tcp://HOST:PORT endpoint")
        if not self.mutual_tls:
            if not self.allow_plaintext_loopback:
                raise ConfigError("TCP needs mutual TLS (--tls-cert/--tls-key/--tls-ca); plaintext is refused")
            if not is_loopback(self.tcp_endpoint.host):
                raise ConfigError("plaintext TCP is allowed on loopback addresses only")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True

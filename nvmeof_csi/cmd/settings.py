"""Typed settings of the executables (frozen dataclasses), built from flags and ``NVMEOF_CSI_*`` environment
variables by the commands in this package and validated here with messages that name the setting.

Nothing below ``cmd/`` imports these types or reads the environment: the wiring hands each component the
plain values it needs.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from nvmeof_csi.cmd.flags import ENV_PREFIX, check_ranges, setting
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.host.egress_guard import parse_guard
from nvmeof_csi.rpc.endpoints import Endpoint, parse_listen
from nvmeof_csi.service.contracts import valid_location
from nvmeof_csi.service.fencing import FENCE_ON_CHOICES, parse_fence_on


def env_var(name: str) -> str:
    """The environment variable that can set a flag, e.g. ``env_var("ENDPOINT")`` -> ``NVMEOF_CSI_ENDPOINT``."""
    return ENV_PREFIX + name


class Mode(StrEnum):
    CONTROLLER = "controller"
    NODE = "node"
    ALL = "all"

    @property
    def controller(self) -> bool:
        return self in (Mode.CONTROLLER, Mode.ALL)

    @property
    def node(self) -> bool:
        return self in (Mode.NODE, Mode.ALL)


class Backend(StrEnum):
    LOOP = "loop"  # development only
    NVMEOF = "nvmeof"  # target agents from a fabric map


def parse_size(text: str) -> int:
    """``10G``, ``512Mi``, ``1T`` or plain bytes -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGTP]?)(i?B?)?\s*", text, re.IGNORECASE)
    if not match:
        raise ConfigError(f"size {text!r} must be a number with an optional K/M/G/T/P suffix")
    power = " KMGTP".index(match.group(2).upper() or " ")
    return int(match.group(1)) << (10 * power)


@dataclass(frozen=True)
class Settings:
    """Everything ``nvmeof-csi serve`` needs. Each field is declared once, with its flag, environment variable,
    help, default and range (:func:`nvmeof_csi.cmd.flags.setting`); ``serve``'s options and docs/configuration.md's
    configuration table are made from these declarations."""

    mode: Mode = setting(Mode.ALL, "`controller`, `node` or `all`: which CSI services to run.")
    endpoint: Endpoint = setting(
        "unix:///run/nvmeof-csi/csi.sock",
        "`unix:///abs/path` or `tcp://127.0.0.1:PORT`; a stale socket file is "
        "replaced, a live server is never displaced.",
        parse=Endpoint.parse,
    )
    backend: Backend = setting(
        Backend.LOOP,
        "`nvmeof` (target agents + kernel initiator) or `loop` (DEVELOPMENT ONLY: no durability, no access control).",
    )
    fabric_map: Path | None = setting(None, "Backend nvmeof, controller side: the YAML list of target agents.")
    zone: str = setting("", "This node's `topology.kubernetes.io/zone`.")
    alluxio_proxy: str = setting(
        "",
        "Controller: the Alluxio REST proxy URL; dataset volumes are placed next to the "
        "Alluxio worker caching their data set (fabric map `alluxioHost`).",
    )
    allow_single_path: bool = setting(
        False,
        "Stage multi-portal volumes over one path when native multipath is off (otherwise FAILED_PRECONDITION).",
        env=False,
    )
    state_dir: Path = setting(
        Path("/var/lib/nvmeof-csi"),
        "Node staging records (written atomically before the "
        "kernel is touched), the node's host identity, loop volumes.",
    )
    node_id: str = setting(
        "", "The CSI node ID (backend loop; with nvmeof the node ID is the node's host NQN).", shown="hostname"
    )
    fabric: str = setting("default", "This node's storage fabric, published as `topology.csi.nvmeof.io/fabric`.")
    loop_capacity_bytes: int = setting(
        "1T",
        "Capacity the loop backend offers (thin), e.g. `1T`, `512Gi`.",
        parse=lambda text: parse_size(str(text)),
        name="loop-capacity",
    )
    max_volumes_per_node: int = setting(
        0, "Reported in NodeGetInfo and enforced at ControllerPublish (0: no limit).", low=0, shown="`0` (no limit)"
    )
    workers: int = setting(
        0,
        "Threads that run the CSI calls' blocking work (calls to agents, mounts, mkfs): each call in flight holds one "
        "until it returns, more wait for a free one. Calls to agents mostly wait on the network: a controller that "
        "many claims reach at once keeps up with more (docs/performance.md).",
        low=0,
        high=512,
        shown="`0` (Python's default: CPUs + 4, at most 32)",
    )
    grace_seconds: float = setting(
        30.0, "On SIGTERM, the seconds in-flight RPCs get before they are cancelled.", low=0, high=600, low_open=True
    )
    log_level: str = setting(
        "INFO",
        "`DEBUG`, `INFO`, `WARNING` or `ERROR`: one line per RPC in and out, with "
        "request ID, volume ID, duration and status; secrets stripped.",
    )
    kubelet_root: Path = setting(
        Path("/var/lib/kubelet"), "The node touches staging and target paths only under it (kubelet's root directory)."
    )
    registration_dir: Path | None = setting(
        None,
        "Register with kubelet ourselves through its `plugins_registry` "
        "folder (where node-driver-registrar cannot run); a refusal is logged "
        "and retried.",
    )
    registration_endpoint: str = setting(
        "", "The CSI socket's path as kubelet (on the host) sees it.", shown="the `--endpoint` path"
    )
    metrics_listen: str = setting(
        "",
        "`HOST:PORT` for Prometheus `/metrics`: RPC durations "
        "(`csi_plugin_operations_seconds`) and, on nodes, per-volume paths and I/O (see "
        "docs/operations.md, Metrics).",
    )
    health_listen: str = setting(
        "",
        "`HOST:PORT` answering `GET /healthz` (readiness: the Probe checks) and `GET /livez` (liveness: the process "
        "answers, no checks) where the livenessprobe sidecar cannot run.",
    )
    qos_period: float = setting(
        5.0,
        "Seconds between the node's passes that bring every published pod's `io.max` to its volume's current limits.",
        low=0.2,
        high=300,
    )
    cgroup_root: Path = setting(Path("/sys/fs/cgroup"), "The cgroup v2 mount holding kubelet's pod cgroups.")
    metrics_pod_uid: bool = setting(
        False, "Label the node's `nvmeof_csi_volume_qos_enforced` by pod UID (off: one series per volume).", env=False
    )
    fence_on: frozenset[str] = setting(
        ",".join(FENCE_ON_CHOICES),
        "Controller: when ControllerUnpublishVolume fences the node (ends its live connections and keeps it "
        "refused until it rebooted): any of `NODE_OUT_OF_SERVICE`, `NODE_CLEANUP_TIMEOUT` (CSI 1.14 reasons), "
        "`taint` (no reason given and the Node has `node.kubernetes.io/out-of-service`), comma-separated; `none`.",
        parse=lambda text: parse_fence_on(str(text)),
    )
    kubeconfig: str = setting(
        "",
        "Controller: where to read Nodes (the out-of-service taint, boot IDs): empty = the in-cluster "
        "service account when running in a pod, else no cluster; a kubeconfig path; `none`.",
    )
    node_signer_ca: Path | None = setting(
        None,
        "Controller: a folder holding the node CA (`tls.crt`, `tls.key`): the controller checks and signs "
        "node identity requests (Kubernetes CSRs for signerName `csi.nvmeof.io/node-client`; docs/security.md).",
    )
    node_signer_requester: str = setting(
        "system:serviceaccount:nvmeof-csi:nvmeof-csi-node",
        "Controller: the only user that may ask for a node identity (the node plugin's service account).",
    )
    agent_signer_requester: str = setting(
        "system:serviceaccount:nvmeof-csi:nvmeof-csi-agent",
        "Controller: the only user that may ask for an agent server identity (the agents' service account); "
        "empty: agent identities are not issued.",
    )
    identity_bindings: str = setting(
        "",
        "Controller, with --node-signer-ca: NAMESPACE/NAME of the ConfigMap (get and update only) where the "
        "signer binds each host NQN to the Node its identity was issued to, durably (docs/security.md).",
    )
    replica_records: str = setting(
        "",
        "Controller: the namespace of the arbiter's records of replicated volumes (one Lease each; get, create, "
        "update, delete); empty: `replicas: 2` is refused and no DRBD fence-peer call is answered.",
    )
    node_identity: str = setting(
        "files",
        "Node: `csr` to ask the controller's signer for this node's own agent client certificate (key made "
        "and kept in the state folder, renewed at 2/3 of its lifetime); `files`: the fabric map's files.",
    )
    node_name: str = setting("", "Node: this Kubernetes node's name (`spec.nodeName`), for `--node-identity csr`.")
    egress_guard: str = setting(
        "",
        "Node: where this node's pods may not connect (the storage portals), space-separated `CIDR`, "
        "`CIDR:PORT` or `CIDR:LOW-HIGH`; the node itself still can (policy routing; docs/security.md).",
    )
    keyring_serial_file: Path | None = setting(
        None,
        "Node: publish the kernel's .nvme keyring serial in this file for `nvmeof-csi tlshd` in another container "
        "(the runtime hides /proc/keys from it); the chart sets it with nvmeTls.handshakeDaemon.",
    )
    node_identity_hours: float = setting(
        24.0, "Lifetime of a node identity certificate, asked for by nodes and capped by the signer.", low=1, high=8760
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        self._check_kubelet_side()
        self._check_identity()
        if not self.kubelet_root.is_absolute() or self.kubelet_root == Path("/"):
            raise ConfigError(f"kubelet-root {self.kubelet_root} must be an absolute path other than /")
        if self.alluxio_proxy and not self.alluxio_proxy.startswith(("http://", "https://")):
            raise ConfigError(f"--alluxio-proxy {self.alluxio_proxy!r} must start with http:// or https://")
        if self.backend is Backend.NVMEOF and self.mode.controller and self.fabric_map is None:
            raise ConfigError("backend nvmeof needs --fabric-map (the YAML list of target agents) for the controller")
        if not self.node_id:
            object.__setattr__(self, "node_id", socket.gethostname())
        if len(self.node_id.encode()) > 192:
            raise ConfigError("node-id must be at most 192 bytes (CSI limit for node IDs)")
        if not valid_location(self.fabric):
            raise ConfigError(f"fabric {self.fabric!r} must be a DNS label (lowercase letters, digits, '-')")
        if self.loop_capacity_bytes <= 0:
            raise ConfigError("loop-capacity must be a positive number of bytes")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log-level must be DEBUG, INFO, WARNING or ERROR")
        if not self.state_dir.is_absolute():
            raise ConfigError(f"state-dir {self.state_dir} must be an absolute path")

    def _check_identity(self) -> None:
        parse_guard(self.egress_guard)
        if self.node_identity not in ("files", "csr"):
            raise ConfigError(f"--node-identity {self.node_identity!r} must be files or csr")
        if self.node_identity == "csr" and not (self.mode.node and self.node_name and self.fabric_map):
            raise ConfigError("--node-identity csr needs --mode node, --node-name and --fabric-map")
        ca = self.node_signer_ca
        if ca is not None and not ((ca / "tls.crt").is_file() and (ca / "tls.key").is_file()):
            raise ConfigError(f"--node-signer-ca {ca} must hold tls.crt and tls.key (the node CA)")
        if self.replica_records and not valid_location(self.replica_records):
            raise ConfigError(f"--replica-records {self.replica_records[:80]!r} must be a namespace (a DNS label)")
        if ca is not None and not self.identity_bindings:
            raise ConfigError("--node-signer-ca needs --identity-bindings (NAMESPACE/NAME of a ConfigMap)")
        for flag, user in (("node", self.node_signer_requester), ("agent", self.agent_signer_requester)):
            if user and not user.startswith("system:serviceaccount:"):
                raise ConfigError(
                    f"--{flag}-signer-requester must be a service account (system:serviceaccount:NS:NAME)"
                )

    def _check_kubelet_side(self) -> None:
        for listen in filter(None, (self.health_listen, self.metrics_listen)):
            parse_listen(listen)
        if self.registration_dir is None:
            return
        if not self.mode.node:
            raise ConfigError("--registration-dir registers a node plugin with kubelet: it needs --mode node or all")
        if self.endpoint.path is None:
            raise ConfigError("--registration-dir needs a unix:// --endpoint (kubelet reaches plugins by socket)")
        if not self.registration_dir.is_absolute():
            raise ConfigError(f"registration-dir {self.registration_dir} must be an absolute path")
        path = self.registration_endpoint or str(self.endpoint.path)
        if not path.startswith("/"):
            raise ConfigError(f"registration-endpoint {path!r} must be the CSI socket's absolute path on the host")
        object.__setattr__(self, "registration_endpoint", path)

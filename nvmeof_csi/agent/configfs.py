"""The kernel NVMe target's configfs tree (``/sys/kernel/config/nvmet``) as a small object model.

Contract:
- Observe, then converge: every ``ensure_*`` reads the current value and writes only what differs (an object
  it has just made is written without reading: its values are the kernel's defaults), so applying the same
  desired state twice changes nothing (no namespace is re-enabled, no port re-bound).
- Objects are matched by whole NQN and whole port ID; there is no prefix matching anywhere.
- ``root`` is injectable: unit tests run against a temp folder. In a plain folder the attribute files and
  default groups that configfs creates by itself do not exist, so the model creates folders with
  ``exist_ok`` and treats an absent attribute as empty.
- Not thread-safe: the agent serialises access per volume and for the shared port objects.
- Errors: a refused configfs write raises :class:`ConfigfsError` (``configfs_tree``, which holds the file
  primitives) naming the path and the errno text;
  asking for DH-HMAC-CHAP on a kernel without it raises ``FailedPrecondition``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nvmeof_csi.agent.configfs_tree import ConfigfsError, ConfigfsTree, refusal
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument
from nvmeof_csi.host.paths import component
from nvmeof_csi.nvmeof.context import ANA_STATES
from nvmeof_csi.nvmeof.dhchap import DHGROUP as DHCHAP_DHGROUP
from nvmeof_csi.nvmeof.dhchap import HASH as DHCHAP_HASH

DEFAULT_ROOT = Path("/sys/kernel/config/nvmet")
DEFAULT_ANA_GROUP = 1
#: a host entry made (and removed) only to learn whether nvmet has DH-HMAC-CHAP attributes
PROBE_HOST = "nqn.2014-08.io.nvmeof:csi:auth-probe"
NO_TARGET_AUTH = (
    "this target kernel's nvmet has no in-band authentication (CONFIG_NVME_TARGET_AUTH, Linux 6.0+ "
    "built with it, e.g. Debian bookworm-backports' 6.12; bookworm's 6.1 lacks it)"
)


#: the controller IDs nvmet gives by default (NVME_CNTLID_MIN .. NVME_CNTLID_MAX)
CNTLID_RANGE = (1, 0xFFEF)


class Nvmet(ConfigfsTree):
    """Operations on one nvmet configfs tree."""

    def __init__(
        self, root: Path = DEFAULT_ROOT, plain_tree: bool = False, cntlid: tuple[int, int] | None = None
    ) -> None:
        """``cntlid``: the window of controller IDs this agent's subsystems give (``attr_cntlid_min``/``max``):
        two agents exposing one subsystem NQN need disjoint windows, or a host refuses the second (a duplicate
        cntlid); ``None``: nvmet's default."""
        super().__init__(root, plain_tree)
        self._cntlid = cntlid
        self._subsystems, self._hosts, self._ports = f"{root}/subsystems", f"{root}/hosts", f"{root}/ports"

    # -- state ---------------------------------------------------------------------------------------------
    def available(self) -> bool:
        return os.path.isdir(self._subsystems) and os.path.isdir(self._ports)

    def subsystems(self) -> list[str]:
        return self._names(self._subsystems)

    def has_subsystem(self, nqn: str) -> bool:
        """True when subsystem ``nqn`` exists (one lookup, not a listing of every subsystem)."""
        return os.path.isdir(self._sub(nqn))

    def ports(self) -> list[int]:
        return sorted(int(p) for p in self._names(self._ports) if p.isdigit())

    def hosts(self) -> list[str]:
        return self._names(self._hosts)

    def supports_dhchap(self) -> bool:
        """True when this kernel's nvmet has DH-HMAC-CHAP (CONFIG_NVME_TARGET_AUTH): a host entry has a
        ``dhchap_key`` attribute. Without any host entry, a probe entry is made and removed again."""
        for host in self._names(self._hosts):
            return os.path.exists(f"{self._hosts}/{host}/dhchap_key")
        probe = f"{self._hosts}/{PROBE_HOST}"
        self._mkdir(self._hosts)
        self._mkdir(probe)
        try:
            return os.path.exists(f"{probe}/dhchap_key")
        finally:
            self._rmdir(probe)

    # -- subsystems and namespaces -----------------------------------------------------------------------
    def _sub(self, nqn: str) -> str:
        return f"{self._subsystems}/{component(nqn, 'subsystem NQN')}"

    def _host(self, host_nqn: str) -> str:
        return f"{self._hosts}/{component(host_nqn, 'host NQN')}"

    def _grant(self, nqn: str, host_nqn: str) -> str:
        return f"{self._sub(nqn)}/allowed_hosts/{component(host_nqn, 'host NQN')}"

    def ensure_subsystem(self, nqn: str, serial: str, model: str) -> None:
        sub = self._sub(nqn)
        made = self._mkdir(sub)
        if self._plain:  # configfs makes a subsystem's default groups itself
            for group in ("namespaces", "allowed_hosts"):
                self._mkdir(f"{sub}/{group}")
        if made:  # a new subsystem: nothing to look at first
            for attr, value in (("attr_allow_any_host", "0"), ("attr_serial", serial), ("attr_model", model)):
                self._put(f"{sub}/{attr}", value)
            self._set_cntlid(sub)
            return
        self._write(f"{sub}/attr_allow_any_host", "0")
        self._set_cntlid(sub)
        if not self.namespaces(nqn):  # identity attributes are frozen once a namespace exists
            self._write(f"{sub}/attr_serial", serial)
            self._write(f"{sub}/attr_model", model)

    def _set_cntlid(self, sub: str) -> None:
        """The subsystem's cntlid window, written in the order the kernel accepts (min never above max)."""
        if self._cntlid is None:
            return
        low, high = self._cntlid
        current_max = self._read(f"{sub}/attr_cntlid_max")
        order = ("max", "min") if current_max.isdigit() and low > int(current_max) else ("min", "max")
        for end in order:
            self._write(f"{sub}/attr_cntlid_{end}", str(low if end == "min" else high))

    def namespaces(self, nqn: str) -> list[int]:
        return sorted(int(n) for n in self._names(f"{self._sub(nqn)}/namespaces") if n.isdigit())

    def namespace_enabled(self, nqn: str, nsid: int) -> bool:
        return self._read(f"{self._sub(nqn)}/namespaces/{nsid}/enable") == "1"

    def ensure_namespace(
        self,
        nqn: str,
        nsid: int,
        device_path: str,
        ns_uuid: str,
        nguid: str,
        buffered_io: bool = False,
        enable: bool = True,
    ) -> None:
        """Namespace ``nsid`` on ``device_path`` with the given identity, enabled. Re-enables only when an
        identity attribute must change (a disabled namespace is enabled). ``enable=False`` (a replica that is not
        primary): made and set, never enabled here; one enabled with other attributes is disabled to change them."""
        ns = f"{self._sub(nqn)}/namespaces/{nsid:d}"
        made = self._mkdir(ns)
        wanted = {
            "device_path": device_path,
            "device_uuid": ns_uuid,
            "device_nguid": nguid,
            "buffered_io": "1" if buffered_io else "0",
            "ana_grpid": str(DEFAULT_ANA_GROUP),
        }
        if made:  # a new, disabled namespace: set everything, then enable, without reading first
            for key, value in wanted.items():
                self._put(f"{ns}/{key}", value)
            if enable:
                self._put(f"{ns}/enable", "1")
            return
        differs = {k: v for k, v in wanted.items() if self._read(f"{ns}/{k}") != v}
        enabled = self._read(f"{ns}/enable") == "1"
        if (enabled or not enable) and not differs:
            return
        if enabled:
            self._write(f"{ns}/enable", "0")
        for key, value in differs.items():
            self._write(f"{ns}/{key}", value)
        if enable:
            self._write(f"{ns}/enable", "1")

    def disable_namespace(self, nqn: str, nsid: int) -> None:
        """Namespace ``nsid`` disabled (its device closed); nothing when it is absent or disabled already."""
        ns = f"{self._sub(nqn)}/namespaces/{nsid:d}"
        if self._read(f"{ns}/enable") == "1":
            self._write(f"{ns}/enable", "0")

    def namespace_attrs(self, nqn: str, nsid: int) -> dict[str, str]:
        ns = f"{self._sub(nqn)}/namespaces/{nsid:d}"
        return {k: self._read(f"{ns}/{k}") for k in ("device_path", "device_uuid", "device_nguid", "enable")}

    def revalidate(self, nqn: str, nsid: int) -> None:
        """Make the namespace report its backing file's new size to hosts (after a resize)."""
        attr = f"{self._sub(nqn)}/namespaces/{nsid:d}/revalidate_size"
        try:
            fd = os.open(attr, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
        except OSError as exc:
            raise ConfigfsError(f"revalidate {attr}: {refusal(exc)}") from exc

    def remove_subsystem(self, nqn: str) -> None:
        """Unlink from every port, drop host grants, disable and remove namespaces, remove the subsystem."""
        sub = self._sub(nqn)
        for port in self.ports():
            self._unlink(self._port_link(port, nqn))
        for host in self._names(f"{sub}/allowed_hosts"):
            self._unlink(self._grant(nqn, host))
        for nsid in self.namespaces(nqn):
            ns = f"{sub}/namespaces/{nsid:d}"
            if self._read(f"{ns}/enable") == "1":
                self._put(f"{ns}/enable", "0")
            self._rmdir(ns)
        self._rmdir(sub)

    # -- hosts -----------------------------------------------------------------------------------------------
    def allowed_hosts(self, nqn: str) -> list[str]:
        return self._names(f"{self._sub(nqn)}/allowed_hosts")

    def ensure_host(self, host_nqn: str, dhchap_key: str = "", ctrl_key: str = "") -> None:
        """The host entry, with its DH-HMAC-CHAP key (hash and DH group first, then the keys; each written only
        when it differs). A key on a kernel without nvmet authentication is ``FailedPrecondition``."""
        host = self._host(host_nqn)
        self._mkdir(self._hosts)
        self._mkdir(host)
        if not dhchap_key:
            return
        if not os.path.exists(f"{host}/dhchap_key"):
            raise FailedPrecondition(NO_TARGET_AUTH)
        wanted = [("dhchap_hash", DHCHAP_HASH), ("dhchap_dhgroup", DHCHAP_DHGROUP), ("dhchap_key", dhchap_key)]
        if ctrl_key:
            wanted.append(("dhchap_ctrl_key", ctrl_key))
        for attr, value in wanted:
            self._write(f"{host}/{attr}", value)

    def allow(self, nqn: str, host_nqn: str) -> None:
        self._link(self._host(host_nqn), self._grant(nqn, host_nqn))

    def deny(self, nqn: str, host_nqn: str) -> None:
        self._unlink(self._grant(nqn, host_nqn))

    def remove_host(self, host_nqn: str) -> None:
        """Remove a host entry that no subsystem allows any more (still allowed: left alone)."""
        if any(host_nqn in self.allowed_hosts(nqn) for nqn in self.subsystems()):
            return
        self._rmdir(self._host(host_nqn))

    # -- ports -----------------------------------------------------------------------------------------------
    def _port(self, port_id: int) -> str:
        return f"{self._ports}/{port_id:d}"

    def _port_link(self, port_id: int, nqn: str) -> str:
        """The link that exports subsystem ``nqn`` on port ``port_id``."""
        return f"{self._port(port_id)}/subsystems/{component(nqn, 'subsystem NQN')}"

    def ensure_port(self, spec: PortSpec) -> None:
        """Port with the spec's address; an address change briefly unlinks the port's subsystems (the
        kernel refuses to change a bound port) and links them again."""
        port = self._port(spec.port_id)
        self._mkdir(port)
        for group in ("subsystems", "ana_groups", f"ana_groups/{DEFAULT_ANA_GROUP}"):
            self._mkdir(f"{port}/{group}")
        wanted = {
            "addr_trtype": spec.trtype,
            "addr_adrfam": spec.adrfam,
            "addr_traddr": spec.traddr,
            "addr_trsvcid": str(spec.trsvcid),
        }
        if spec.tls or self._read(f"{port}/addr_tsas") not in ("", "none"):  # a TLS port, or one that was
            wanted |= {"addr_tsas": "tls1.3" if spec.tls else "none"}
            wanted |= {"addr_treq": "required" if spec.tls else "not specified"}
        if all(self._read(f"{port}/{k}") == v for k, v in wanted.items()):
            return
        linked = self.linked(spec.port_id)
        for nqn in linked:
            self._unlink(f"{port}/subsystems/{nqn}")
        for key, value in wanted.items():
            self._write(f"{port}/{key}", value)
        for nqn in linked:
            self.link(spec.port_id, nqn)

    def linked(self, port_id: int) -> list[str]:
        return self._names(f"{self._port(port_id)}/subsystems")

    def link(self, port_id: int, nqn: str) -> None:
        self._link(self._sub(nqn), self._port_link(port_id, nqn))

    def unlink(self, port_id: int, nqn: str) -> None:
        self._unlink(self._port_link(port_id, nqn))

    def set_ana(self, port_id: int, state: str, group: int = DEFAULT_ANA_GROUP) -> bool:
        if state not in ANA_STATES:
            raise InvalidArgument(f"ANA state {state!r} must be one of {', '.join(ANA_STATES)}")
        folder = f"{self._port(port_id)}/ana_groups/{group:d}"
        self._mkdir(folder)
        return self._write(f"{folder}/ana_state", state)

    def ana_state(self, port_id: int, group: int = DEFAULT_ANA_GROUP) -> str:
        return self._read(f"{self._port(port_id)}/ana_groups/{group:d}/ana_state") or "optimized"

    def remove_port(self, port_id: int) -> None:
        port = self._port(port_id)
        for nqn in self.linked(port_id):
            self._unlink(f"{port}/subsystems/{nqn}")
        for group in self._names(f"{port}/ana_groups"):
            if group != str(DEFAULT_ANA_GROUP):
                self._rmdir(f"{port}/ana_groups/{group}")
        self._rmdir(port)

    # -- whole tree ------------------------------------------------------------------------------------------
    def dump(self) -> dict[str, Any]:
        """Everything the agent manages, as plain data (for comparisons and diagnostics)."""
        subsystems = {}
        for nqn in self.subsystems():
            sub = self._sub(nqn)
            subsystems[nqn] = {
                "allow_any_host": self._read(f"{sub}/attr_allow_any_host"),
                "serial": self._read(f"{sub}/attr_serial"),
                "hosts": self.allowed_hosts(nqn),
                "namespaces": {str(n): self.namespace_attrs(nqn, n) for n in self.namespaces(nqn)},
            }
        ports = {}
        for port_id in self.ports():
            port = self._port(port_id)
            ports[str(port_id)] = {
                "addr": [self._read(f"{port}/{k}") for k in ("addr_trtype", "addr_traddr", "addr_trsvcid")],
                "tls": self._read(f"{port}/addr_tsas") == "tls1.3",
                "subsystems": self.linked(port_id),
                "ana": self.ana_state(port_id),
            }
        return {"subsystems": subsystems, "ports": ports, "hosts": self.hosts()}

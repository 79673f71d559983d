"""The kernel NVMe host's view of subsystems, controllers (paths), namespaces and ANA states, read from sysfs
(never from nvme-cli text).

Contract: pure reads under an injectable ``root`` (``/sys``); a file that vanishes mid-read means "absent"
(a controller being deleted is simply not listed); subsystems are matched by whole NQN; a namespace is found
by its UUID, never guessed from device order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
        return ""
    except OSError:
        return ""


def parse_address(text: str) -> dict[str, str]:
    """``traddr=127.0.0.1,trsvcid=4420,src_addr=...`` -> a dict."""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs}


@dataclass(frozen=True)
class Controller:
    """One path: a controller of a subsystem, with its state (live, connecting, resetting, deleting ...)."""

    name: str
    state: str
    transport: str
    address: dict[str, str]
    hostnqn: str

    @property
    def portal(self) -> str:
        return f"{self.transport}:{self.address.get('traddr', '')}:{self.address.get('trsvcid', '')}"


@dataclass(frozen=True)
class PathState:
    controller: str
    ana_state: str


@dataclass(frozen=True)
class Namespace:
    """A native-multipath head device (``nvmeXnY``) and its per-controller paths."""

    name: str
    nsid: int
    uuid: str
    size_bytes: int
    paths: tuple[PathState, ...]

    @property
    def device(self) -> str:
        return f"/dev/{self.name}"


@dataclass(frozen=True)
class Subsystem:
    name: str
    nqn: str
    controllers: tuple[Controller, ...]
    namespaces: tuple[Namespace, ...]

    def live(self) -> list[Controller]:
        return [c for c in self.controllers if c.state == "live"]


class NvmeSysfs:
    def __init__(self, root: Path = Path("/sys")) -> None:
        self.root = root

    def multipath_enabled(self) -> bool | None:
        """Native multipath (``nvme_core.multipath``): True, False, or None when nvme_core is not loaded."""
        value = _read(self.root / "module" / "nvme_core" / "parameters" / "multipath")
        return None if not value else value == "Y"

    def _controller(self, name: str) -> Controller | None:
        base = self.root / "class" / "nvme" / name
        state = _read(base / "state")
        if not state:
            return None
        return Controller(name, state, _read(base / "transport"), parse_address(_read(base / "address")),
                          _read(base / "hostnqn"))

    def _namespace(self, subsys: str, head: str, controllers: list[str]) -> Namespace | None:
        block = self.root / "block" / head
        uuid, nsid = _read(block / "uuid"), _read(block / "nsid")
        if not nsid.isdigit():
            return None
        size = _read(block / "size")
        paths = []
        for ctrl in controllers:
            path_dev = f"nvme{subsys}c{ctrl.removeprefix('nvme')}n{head.rsplit('n', 1)[1]}"
            ana = _read(self.root / "block" / path_dev / "ana_state")
            if ana:
                paths.append(PathState(ctrl, ana))
        return Namespace(head, int(nsid), uuid, int(size) * 512 if size.isdigit() else 0, tuple(paths))

    def _entries(self) -> list[tuple[Path, str]]:
        """Every NVMe subsystem folder with its NQN: one read each (a node may have hundreds)."""
        base = self.root / "class" / "nvme-subsystem"
        found = []
        for entry in sorted(base.glob("nvme-subsys*")) if base.is_dir() else []:
            nqn = _read(entry / "subsysnqn")
            if nqn:
                found.append((entry, nqn))
        return found

    @staticmethod
    def _children(entry: Path) -> tuple[list[str], list[str]] | None:
        """(controller names, head device names) of a subsystem folder; None when it vanished."""
        instance = entry.name.removeprefix("nvme-subsys")
        try:
            children = sorted(p.name for p in entry.iterdir())
        except OSError:
            return None
        ctrl_names = [c for c in children if c.startswith("nvme") and c[4:].isdigit()]
        heads = [c for c in children if c.startswith(f"nvme{instance}n") and c[len(f"nvme{instance}n"):].isdigit()]
        return ctrl_names, heads

    def _parse(self, entry: Path, nqn: str) -> Subsystem | None:
        listed = self._children(entry)
        if listed is None:
            return None
        ctrl_names, heads = listed
        instance = entry.name.removeprefix("nvme-subsys")
        controllers = tuple(c for c in (self._controller(n) for n in ctrl_names) if c is not None)
        namespaces = tuple(n for n in (self._namespace(instance, h, ctrl_names) for h in heads) if n)
        return Subsystem(entry.name, nqn, controllers, namespaces)

    def subsystems(self) -> list[Subsystem]:
        return [sub for sub in (self._parse(entry, nqn) for entry, nqn in self._entries()) if sub is not None]

    def subsystem(self, nqn: str) -> Subsystem | None:
        """The subsystem with exactly this NQN (``vol1`` never matches ``vol10``); only it is read in full."""
        return next((self._parse(entry, found) for entry, found in self._entries() if found == nqn), None)

    def find_namespace(self, ns_uuid: str) -> Namespace | None:
        """The head device whose namespace UUID is ``ns_uuid`` (one read per head device, then only the match
        is read in full)."""
        wanted = ns_uuid.lower()
        for entry, _ in self._entries():
            listed = self._children(entry)
            if listed is None:
                continue
            ctrl_names, heads = listed
            for head in heads:
                if _read(self.root / "block" / head / "uuid").lower() == wanted:
                    return self._namespace(entry.name.removeprefix("nvme-subsys"), head, ctrl_names)
        return None

"""Pod cgroups (cgroup v2) and their ``io.max``: where the node applies a volume's per-pod I/O limits.

Kubelet lays pod cgroups out in one of two ways (``--cgroup-driver``):

- cgroupfs: ``kubepods/pod<uid>`` (Guaranteed), ``kubepods/burstable/pod<uid>``, ``kubepods/besteffort/pod<uid>``
- systemd: ``kubepods.slice/kubepods-pod<uid_>.slice``, ``kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_>.slice``, ... (``uid_``: the UID with ``-`` replaced by ``_``)

Contract:
- A pod UID that is not a canonical UUID is refused (``InvalidArgument``): it comes from the request and is
  part of a path.
- :meth:`PodCgroups.find` returns the pod's cgroup folder or ``None``; it never creates one.
- :meth:`PodCgroups.set_io_max` writes one device's line; :meth:`PodCgroups.clear_io_max` removes it (a
  vanished cgroup is not an error: the pod is gone and its limits with it). :meth:`PodCgroups.io_max` reads
  the lines back (device -> fields).
- :meth:`PodCgroups.io_controller` says whether limits can be enforced at all (cgroup v2 with the ``io``
  controller available to pod cgroups), and why not.
"""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path

from nvmeof_csi.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
QOS_CLASSES = ("", "burstable", "besteffort")  # "" = Guaranteed, directly under kubepods
DEFAULT_ROOT = Path("/sys/fs/cgroup")


def check_pod_uid(uid: str) -> str:
    if not UUID_RE.match(uid):
        raise InvalidArgument(f"pod UID {uid[:64]!r} is not a canonical lower-case UUID")
    return uid


class PodCgroups:
    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = root

    def candidates(self, pod_uid: str) -> list[Path]:
        uid = check_pod_uid(pod_uid)
        under = uid.replace("-", "_")
        found = []
        for qos in QOS_CLASSES:
            found.append(self.root / "kubepods" / qos / f"pod{uid}" if qos else self.root / "kubepods" / f"pod{uid}")
            slice_ = self.root / "kubepods.slice"
            if qos:
                found.append(slice_ / f"kubepods-{qos}.slice" / f"kubepods-{qos}-pod{under}.slice")
            else:
                found.append(slice_ / f"kubepods-pod{under}.slice")
        return found

    def find(self, pod_uid: str) -> Path | None:
        return next((path for path in self.candidates(pod_uid) if (path / "cgroup.procs").is_file()), None)

    def io_controller(self) -> tuple[bool, str]:
        """(available, why not): cgroup v2 mounted at the root, ``io`` among its controllers."""
        controllers = self.root / "cgroup.controllers"
        if not controllers.is_file():
            return False, f"{self.root} is not a cgroup v2 hierarchy (cgroup v1 or not mounted)"
        if "io" not in controllers.read_text().split():
            return False, f"the cgroup v2 io controller is not available at {self.root}"
        return True, ""

    def io_max(self, cgroup: Path) -> dict[str, dict[str, str]]:
        """``io.max`` of ``cgroup``: ``{"259:3": {"riops": "500", "wiops": "max", ...}}`` (empty if unreadable)."""
        try:
            text = (cgroup / "io.max").read_text()
        except OSError:
            return {}
        lines: dict[str, dict[str, str]] = {}
        for line in text.splitlines():
            device, *fields = line.split()
            lines[device] = dict(f.split("=", 1) for f in fields if "=" in f)
        return lines

    def set_io_max(self, cgroup: Path, line: str) -> None:
        try:
            (cgroup / "io.max").write_text(line + "\n")
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise FailedPrecondition(f"cgroup {cgroup} has no io.max (io controller not enabled for it)") from exc
            raise FailedPrecondition(f"cannot write io.max of {cgroup}: {exc.strerror}") from exc

    def clear_io_max(self, cgroup: Path, major_minor: str) -> None:
        try:
            (cgroup / "io.max").write_text(f"{major_minor} riops=max wiops=max rbps=max wbps=max\n")
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # the device is gone; so is its line
                return
            raise FailedPrecondition(f"cannot clear io.max of {cgroup}: {exc.strerror}") from exc

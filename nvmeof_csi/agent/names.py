"""Name reservations: CSI volume name -> (volume UUID, agent), kept by the agent a controller picks as the
name's home, so that controllers racing on one name agree on one volume before anything is made.

Layout: ``<state folder>/names/<sha256 of the name, hex>.json`` holding ``{"version", "name", "volume_uuid",
"agent"}``. The file name is a digest, so a hostile name never reaches a path; the name inside is compared on
every read (a digest collision is refused, never mistaken for another name).

Contract:
- :meth:`NameBook.reserve` is create-if-absent in one atomic step (``host.atomic.create_exclusive``): of any
  number of racing callers exactly one reservation is kept, and every caller gets the kept one back. Durable
  when it returns.
- :meth:`NameBook.lookup` is a pure read: it never writes, waits or stamps anything.
- :meth:`NameBook.release` removes a reservation only while it holds the given volume UUID (a release that comes
  late never removes a newer reservation of the same name); durable when it returns; absent is success.
- A file that cannot be read, or holds another name, raises ``DriverError`` (never a silent "not reserved").
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvmeof_csi.errors import Aborted, DriverError, InvalidArgument
from nvmeof_csi.host.atomic import create_exclusive, remove_durably
from nvmeof_csi.nvmeof.nqn import check_uuid

FORMAT_VERSION = 1
FOLDER = "names"
MAX_NAME_BYTES = 256  # as every name the agent's API accepts
MAX_AGENT_BYTES = 253


@dataclass(frozen=True)
class Reservation:
    name: str
    volume_uuid: str
    agent: str


def check_name(name: str) -> str:
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidArgument(f"name must be 1..{MAX_NAME_BYTES} bytes")
    return name


def check_reservation(res: Reservation) -> Reservation:
    check_name(res.name)
    check_uuid(res.volume_uuid, "volume_uuid")
    if not res.agent or len(res.agent.encode()) > MAX_AGENT_BYTES or not res.agent.isprintable():
        raise InvalidArgument(f"agent must be a printable name of 1..{MAX_AGENT_BYTES} bytes")
    return res


class NameBook:
    """The reservations kept in ``state_folder / names``."""

    def __init__(self, state_folder: Path) -> None:
        self.folder = state_folder / FOLDER
        self._lock = threading.Lock()  # orders a release against a reserve of the same name in this process

    def _path(self, name: str) -> Path:
        return self.folder / f"{hashlib.sha256(name.encode()).hexdigest()}.json"

    def lookup(self, name: str) -> Reservation | None:
        """The reservation of ``name``, or ``None``. Reads one file; writes nothing."""
        path = self._path(check_name(name))
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DriverError(f"name reservation {path} is unreadable: {exc}") from exc
        return self._parse(path, name, text)

    @staticmethod
    def _parse(path: Path, name: str, text: str) -> Reservation:
        try:
            doc: Any = json.loads(text)
            version = doc.get("version") if isinstance(doc, dict) else None
            res = check_reservation(Reservation(str(doc["name"]), str(doc["volume_uuid"]), str(doc["agent"])))
        except (ValueError, KeyError, TypeError, AttributeError, InvalidArgument) as exc:
            raise DriverError(f"name reservation {path} is unreadable: {exc!r}") from exc
        if version != FORMAT_VERSION:
            raise DriverError(f"name reservation {path} has format {version!r}, not {FORMAT_VERSION}")
        if res.name != name:
            raise DriverError(f"name reservation {path} holds {res.name!r}, not {name!r}; refusing to guess")
        return res

    def reserve(self, wanted: Reservation) -> Reservation:
        """Keep ``wanted`` unless ``wanted.name`` is reserved already; returns the reservation kept."""
        check_reservation(wanted)
        doc = {"version": FORMAT_VERSION, "name": wanted.name, "volume_uuid": wanted.volume_uuid, "agent": wanted.agent}
        with self._lock:
            if create_exclusive(self._path(wanted.name), (json.dumps(doc, sort_keys=True) + "\n").encode()):
                return wanted
            kept = self.lookup(wanted.name)
        if kept is None:  # released between the two steps: the caller retries
            raise Aborted(f"the reservation of {wanted.name!r} was released while it was read; retry")
        return kept

    def release(self, name: str, volume_uuid: str) -> None:
        """Remove the reservation of ``name`` if it holds ``volume_uuid``."""
        check_uuid(volume_uuid, "volume_uuid")
        with self._lock:
            kept = self.lookup(name)
            if kept is not None and kept.volume_uuid == volume_uuid:
                remove_durably(self._path(name))

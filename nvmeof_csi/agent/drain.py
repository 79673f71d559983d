"""Whether an operator asked this storage node to hand its replicated volumes over to their peers (``nvmeofctl
storage drain``: maintenance). The mark is a file in the agent's state folder, so an agent restarted mid-drain
still drains; the controller reads it from Health and moves each volume this node is primary for to its peer
(a planned switchover, ``service/failover.py``). The agent itself changes no role on its own.

Contract: :meth:`DrainMark.draining` is False when the file is absent, and False with a warning when it cannot be
read (Health must still answer: an agent that did not would look dead to the controller); :meth:`DrainMark.set`
writes it atomically (durable before it returns) and returns the new value; clearing an absent mark changes
nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nvmeof_csi.host.atomic import read_json, remove_durably, write_json_atomic

FILE = "drain.json"
log = logging.getLogger(__name__)


class DrainMark:
    def __init__(self, folder: Path) -> None:
        self._path = folder / FILE

    def draining(self) -> bool:
        try:
            doc = read_json(self._path)
        except (OSError, ValueError) as err:
            log.warning("drain mark %s cannot be read (%s): not draining", self._path, type(err).__name__)
            return False
        return isinstance(doc, dict) and doc.get("draining") is True

    def set(self, draining: bool) -> bool:
        if draining:
            write_json_atomic(self._path, {"draining": True})
        else:
            remove_durably(self._path)
        return draining


__all__ = ["DrainMark"]

"""A key roll on the node: the live controllers of a staged ``auth`` volume take the DH-HMAC-CHAP keys its agent
issues now (``nvmeofctl hosts rotate-key`` on the agent; the node's periodic pass brings them here).

Contract: :func:`roll_keys` writes each key that differs from what a controller of the volume's subsystem holds to
that controller's sysfs attribute (``dhchap_secret``, ``dhchap_ctrl_secret``): the kernel re-authenticates the
live controller at once, without dropping its I/O, and its later reconnects use the new key. The agent changes
one key per rotation, so a re-authentication never meets two changed keys. A controller whose attribute cannot
be read or written is reported in the returned actions, never raised. No key is ever logged or returned.
"""

from __future__ import annotations

import logging

from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.nvmeof.dhchap import HostKeys

log = logging.getLogger(__name__)


def roll_keys(sysfs: NvmeSysfs, volume: str, nqn: str, keys: HostKeys) -> list[str]:
    """Bring every controller of subsystem ``nqn`` to ``keys``; returns what changed (or failed)."""
    sub = sysfs.subsystem(nqn)
    actions = []
    for ctrl in sub.controllers if sub else ():
        base = sysfs.root / "class" / "nvme" / ctrl.name
        for attr, value in (("dhchap_secret", keys.key), ("dhchap_ctrl_secret", keys.ctrl_key)):
            if not value:
                continue
            try:
                if (base / attr).read_text().strip() == value:
                    continue
                (base / attr).write_text(value)
            except OSError as exc:
                log.warning("volume %s: %s: cannot set %s: %s", volume, ctrl.name, attr, exc.strerror)
                actions.append(f"volume {volume}: {ctrl.name}: {attr} not rolled ({exc.strerror})")
                continue
            log.info("volume %s: %s re-authenticates with the agent's new %s", volume, ctrl.name, attr)
            actions.append(f"volume {volume}: {ctrl.name} re-authenticated with a new {attr}")
    return actions

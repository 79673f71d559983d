"""``nvmeofctl storage doctor``: is this storage node ready for replicated volumes (``replicas: "2"``)? Each check
passes or fails with the fix, as ``nvmeofctl doctor`` does for a GPU node.

Checks: the kernel's in-tree DRBD 8.4 (loaded, or loadable: ``modinfo``), drbd-utils' 8.4 tools, DRBD's
usermode helper pointing at the agent's fence-peer helper (else a cut-off primary's fence-peer call never reaches
the controller), and the controller-ID window of every subsystem whose namespace is a DRBD device (the nvmet
default, 1-65519, on both nodes of a pair makes the host refuse the second node's controllers: "Duplicate
cntlid").

Contract: :func:`diagnose_storage` never raises; it reads only the roots it is given and runs ``modinfo`` through
the injected executor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.initiator.doctor import Check, read_value

NVMET_CNTLID = (1, 0xFFEF)  # nvmet's own window: what a subsystem gets without --cntlid-window
AGENT_HELPER = "/run/nvmeof-csi/drbd/drbd-helper"  # the agent's default --drbd-helper-dir, and its script


@dataclass(frozen=True)
class StorageRoots:
    """Where the checks read (the real ones by default; a test's folders otherwise)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    configfs: Path = Path("/sys/kernel/config")
    tools: Path = Path("/usr/lib/drbd")


def check_module(roots: StorageRoots, executor: Executor) -> Check:
    loaded = read_value(roots.proc / "drbd").splitlines()
    version = loaded[0].removeprefix("version:").split()[0] if loaded and loaded[0].startswith("version:") else ""
    where = "loaded"
    if not version:
        try:
            version = executor.run(["modinfo", "-F", "version", "drbd"], timeout=30).out.strip()
            where = "not loaded (the agent loads it)"
        except DriverError:
            version = ""
    if version.startswith("8.4."):
        return Check("DRBD module", True, f"DRBD {version}, {where}")
    found = f"DRBD {version} ({where})" if version else "no DRBD module"
    return Check(
        "DRBD module",
        False,
        found,
        "boot a kernel with the in-tree DRBD 8.4 (CONFIG_BLK_DEV_DRBD: every Debian kernel); an out-of-tree DRBD 9 "
        "module is not what the agent drives",
    )


def check_tools(roots: StorageRoots) -> Check:
    tools = [roots.tools / name for name in ("drbdadm-84", "drbdsetup-84", "drbdmeta-84")]
    missing = [t.name for t in tools if not os.access(t, os.X_OK)]
    if missing:
        return Check("drbd-utils", False, f"missing in {roots.tools}: {', '.join(missing)}", "apt install drbd-utils")
    return Check("drbd-utils", True, f"{', '.join(t.name for t in tools)} in {roots.tools}")


def check_helper(roots: StorageRoots, helper: str) -> Check:
    set_to = read_value(roots.sys / "module" / "drbd" / "parameters" / "usermode_helper")
    if not set_to:
        return Check(
            "fence-peer helper", True, "DRBD is not loaded: the agent sets its helper when it loads it", absent=True
        )
    if set_to == helper:
        return Check("fence-peer helper", True, f"DRBD's usermode helper is the agent's ({helper})")
    return Check(
        "fence-peer helper",
        False,
        f"DRBD's usermode helper is {set_to[:120]!r}, not the agent's {helper}",
        "start the agent with --replication-address (it sets the helper); until then a primary cut off from its "
        "peer asks nobody to fence it and its writes stay frozen",
    )


def check_cntlid(roots: StorageRoots) -> Check:
    subsystems = roots.configfs / "nvmet" / "subsystems"
    default, windows = [], set()
    for sub in sorted(subsystems.glob("*")) if subsystems.is_dir() else []:
        devices = [read_value(ns / "device_path") for ns in (sub / "namespaces").glob("*")]
        if not any(d.startswith("/dev/drbd") for d in devices):
            continue
        window = (read_value(sub / "attr_cntlid_min"), read_value(sub / "attr_cntlid_max"))
        windows.add("-".join(window))
        if window == tuple(str(n) for n in NVMET_CNTLID):
            default.append(sub.name)
    if default:
        return Check(
            "cntlid window",
            False,
            f"{len(default)} replicated subsystem(s) with nvmet's own window 1-65519, e.g. {default[0][:80]}",
            "start the agent with --cntlid-window, a window of its own on each storage node (e.g. 1-999 and "
            "1000-1999): the host refuses a controller ID it already holds from the other node",
        )
    if not windows:
        return Check("cntlid window", True, "no replicated subsystem here yet", absent=True)
    return Check("cntlid window", True, f"replicated subsystems' windows: {', '.join(sorted(windows))}")


def diagnose_storage(executor: Executor, roots: StorageRoots, helper: str = AGENT_HELPER) -> list[Check]:
    return [check_module(roots, executor), check_tools(roots), check_helper(roots, helper), check_cntlid(roots)]


__all__ = ["AGENT_HELPER", "StorageRoots", "diagnose_storage"]

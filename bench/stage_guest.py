"""Guest half of ``bench/stage.py`` (runs inside the lab VM, next to the driver).

usage: python -m bench.stage_guest DRIVER_SOCKET ROUNDS RAW_POOL_DIR

Each round provisions and attaches two volumes through CSI (not timed), then times, in alternating order:
  csi:  NodeStageVolume + NodePublishVolume (ext4, mount mode) through the driver
  bare: the same volume's portals connected with plain ``nvme connect``, the head device found by namespace
        UUID in sysfs (50 ms polling), ``mkfs.ext4`` with the same options, mount, bind mount
then the way down, also in alternating order:
  csi:  NodeUnpublishVolume + NodeUnstageVolume       bare: ``umount`` twice + ``nvme disconnect``
and the controller's way down of a volume with one host allowed:
  csi:  ControllerUnpublishVolume + DeleteVolume through the driver and its agent
  raw:  the durable raw script (``bench/provision_scripts.py``) on a volume it made with one host allowed: the
        host's link removed and the record rewritten durably, then the volume deleted durably
Prints one JSON object with per-round times and medians.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.provision_scripts import CFS, SIZE, raw_create, raw_delete
from lab.csi_ops import Csi
from nvmeof_csi.host.atomic import write_json_atomic

MiB = 1 << 20
MKFS = ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def find_head(ns_uuid: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for block in Path("/sys/block").glob("nvme*n*"):
            if "c" in block.name[4:]:
                continue
            try:
                if (block / "uuid").read_text().strip() == ns_uuid:
                    return f"/dev/{block.name}"
            except OSError:
                continue
        time.sleep(0.05)
    raise TimeoutError(f"namespace {ns_uuid} did not appear")


def bare_stage(vol: dict[str, object]) -> None:
    ctx = vol["context"]
    assert isinstance(ctx, dict)
    for portal in ctx["portals"].split(","):
        trtype, addr, port = portal.split(":")
        run("nvme", "connect", "-t", trtype, "-a", addr, "-s", port, "-n", ctx["nqn"])
    device = find_head(ctx["namespaceUUID"])
    staging, target = Path(str(vol["staging"])), Path(str(vol["target"]))
    staging.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    run(*MKFS, device)
    run("mount", "-t", "ext4", device, str(staging))
    run("mount", "--bind", str(staging), str(target))


def bare_unstage(vol: dict[str, object]) -> None:
    ctx = vol["context"]
    assert isinstance(ctx, dict)
    run("umount", str(vol["target"]))
    run("umount", str(vol["staging"]))
    run("nvme", "disconnect", "-n", ctx["nqn"])


RAW_HOST = "nqn.2014-08.org.nvmexpress:uuid:62656e63-6872-6177-2d68-6f7374000001"  # the raw floor's host


def raw_with_host(pool: Path, ports: list[str]) -> str:
    """A raw volume (durable script) with RAW_HOST allowed and recorded."""
    vol = raw_create(pool, ports, durable=True)
    (CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:raw:{vol}" / "allowed_hosts" / RAW_HOST).symlink_to(
        CFS / "hosts" / RAW_HOST
    )
    write_json_atomic(pool / "records" / f"{vol}.json", {"uuid": vol, "size": SIZE, "hosts": [RAW_HOST]})
    return vol


def raw_detach_delete(pool: Path, ports: list[str], vol: str) -> None:
    """The host's grant revoked durably, then the volume deleted durably."""
    (CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:raw:{vol}" / "allowed_hosts" / RAW_HOST).unlink()
    write_json_atomic(pool / "records" / f"{vol}.json", {"uuid": vol, "size": SIZE, "hosts": []})
    raw_delete(pool, ports, vol, durable=True)


def timed(*calls: Callable[[], object]) -> float:
    """Seconds the calls take, one after the other."""
    begin = time.monotonic()
    for call in calls:
        call()
    return time.monotonic() - begin


def medians(times: dict[str, list[float]], a: str, b: str, ratio: str) -> dict[str, object]:
    """Per-round milliseconds of ``a`` and ``b``, their medians and the ratio of the medians (key ``ratio``)."""
    med = {k: statistics.median(times[k]) for k in (a, b)}
    return {
        f"{a}_ms": [round(t * 1000, 1) for t in times[a]],
        f"{b}_ms": [round(t * 1000, 1) for t in times[b]],
        f"{a}_median_ms": round(med[a] * 1000, 1),
        f"{b}_median_ms": round(med[b] * 1000, 1),
        ratio: round(med[a] / med[b], 2),
    }


def main(sock: str, rounds: int, pool: Path) -> dict[str, object]:
    csi = Csi(sock)
    ports = sorted(p.name for p in (CFS / "ports").iterdir())
    (pool / "records").mkdir(parents=True, exist_ok=True)
    (CFS / "hosts" / RAW_HOST).mkdir(exist_ok=True)
    times: dict[str, list[float]] = {k: [] for k in ("csi", "bare", "down_csi", "down_bare", "ctl_csi", "ctl_raw")}
    for i in range(rounds):
        names = {"csi": f"bench-csi-{i}", "bare": f"bench-bare-{i}"}
        for name in names.values():
            csi.create(name, 128 * MiB)
            csi.attach(name)
        order = ["csi", "bare"] if i % 2 == 0 else ["bare", "csi"]
        for kind in order:
            name = names[kind]
            begin = time.monotonic()
            if kind == "csi":
                csi.stage(name)
                csi.publish(name)
            else:
                bare_stage(csi.ledger[name])
            times[kind].append(time.monotonic() - begin)
        mine, bare = names["csi"], csi.ledger[names["bare"]]
        for kind in reversed(order):
            if kind == "csi":
                times["down_csi"].append(timed(partial(csi.unpublish, mine), partial(csi.unstage, mine)))
            else:
                times["down_bare"].append(timed(partial(bare_unstage, bare)))
        csi.detach(names["bare"])
        csi.delete(names["bare"])
        raw = raw_with_host(pool, ports)
        for kind in order:
            if kind == "csi":
                times["ctl_csi"].append(timed(partial(csi.detach, mine), partial(csi.delete, mine)))
            else:
                times["ctl_raw"].append(timed(partial(raw_detach_delete, pool, ports, raw)))
    (CFS / "hosts" / RAW_HOST).rmdir()
    return {
        "rounds": rounds,
        **medians(times, "csi", "bare", "ratio_median"),
        **medians(times, "down_csi", "down_bare", "down_ratio_median"),
        **medians(times, "ctl_csi", "ctl_raw", "ctl_ratio_median"),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))))

"""Guest half of ``bench/stage.py`` (runs inside the lab VM, next to the driver).

usage: python -m bench.stage_guest DRIVER_SOCKET ROUNDS

Each round provisions and attaches two volumes through CSI (not timed), then times, in alternating order:
  csi:  NodeStageVolume + NodePublishVolume (ext4, mount mode) through the driver
  bare: the same volume's portals connected with plain ``nvme connect``, the head device found by namespace
        UUID in sysfs (50 ms polling), ``mkfs.ext4`` with the same options, mount, bind mount
and undoes both (not timed). Prints one JSON object with per-round times and medians.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lab.csi_ops import Csi

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


def main(sock: str, rounds: int) -> dict[str, object]:
    csi = Csi(sock)
    times: dict[str, list[float]] = {"csi": [], "bare": []}
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
        csi.unpublish(names["csi"])
        csi.unstage(names["csi"])
        bare_unstage(csi.ledger[names["bare"]])
        for name in names.values():
            csi.detach(name)
            csi.delete(name)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "rounds": rounds,
        "csi_ms": [round(t * 1000, 1) for t in times["csi"]],
        "bare_ms": [round(t * 1000, 1) for t in times["bare"]],
        "csi_median_ms": round(med["csi"] * 1000, 1),
        "bare_median_ms": round(med["bare"] * 1000, 1),
        "ratio_median": round(med["csi"] / med["bare"], 2),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))

"""Guest half of the node benchmarks of ``bench/stage.py`` (runs inside the lab VM, next to the driver).

usage: python -m bench.node_guest DRIVER_SOCKET DRIVER_PID [--fio-seconds 4] [--fio-rounds 8]
                                  [--controllers 64 128] [--scale-rounds 5] [--cycles 500]

Prints one JSON object with three parts:
- ``datapath``: fio (libaio, O_DIRECT) 4 KiB random read and write at queue depth 16 and 128 KiB sequential
  read and write, on the raw namespace (a volume connected with plain ``nvme connect``, its head device), on a
  block volume published through the driver, and on a file in an ext4 volume published through the driver
  (every region written once first, so no target reads holes), and on a file in ext4 made and mounted by hand
  on another raw namespace (``ext4``: the same mkfs options, no driver: what the filesystem itself costs),
  alternated round by round; the median IOPS per job and target, and each target's ratio to raw (the mount's
  also to ``ext4``: the driver's own share). The raw namespace is measured twice (``raw-again``, an A/A run):
  its ratio to raw is the lab's own noise, against which the driver's ratios are read.
- ``scaling``: NodeStage+NodePublish median with 0, 64 and 128 other NVMe controllers on the node (other
  subsystems connected through ``/dev/nvme-fabrics`` directly, one path each).
- ``resources``: the driver's RSS and open file descriptors sampled over CYCLES stage/publish/unpublish/
  unstage cycles of one volume.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.provision_guest import resources
from bench.provision_scripts import CFS
from bench.stage_guest import MKFS, MiB, find_head
from lab.csi_ops import Csi
from lab.guest_files import write_probe_file

JOBS = {  # name: (rw, block size, iodepth)
    "randread-4k-qd16": ("randread", "4k", 16),
    "randwrite-4k-qd16": ("randwrite", "4k", 16),
    "read-128k": ("read", "128k", 4),
    "write-128k": ("write", "128k", 4),
}
FIO_SIZE = "96M"
BARE_FS = Path("/scratch/bench-bare-ext4")
OTHER_POOL = Path("/scratch/bench-other")
OTHER_NQN = "nqn.2026-11.io.nvmeof:bench-other:{}"


def fio(target: str, job: str, seconds: float, once: bool = False) -> float:
    """IOPS of one fio job on ``target`` (a device or a file): for ``seconds``, or one pass over the region."""
    rw, bs, depth = JOBS[job]
    timing = [] if once else ["--time_based", f"--runtime={seconds}", "--ramp_time=1"]
    out = subprocess.run(
        [
            "fio",
            "--name=bench",
            f"--filename={target}",
            f"--rw={rw}",
            f"--bs={bs}",
            f"--iodepth={depth}",
            "--ioengine=libaio",
            "--direct=1",
            f"--size={FIO_SIZE}",
            *timing,
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=seconds + 600,
    ).stdout
    job_doc = json.loads(out[out.index("{") :])["jobs"][0]
    return float(job_doc["read"]["iops"] + job_doc["write"]["iops"])


def bare_connect(csi: Csi, name: str) -> str:
    """A volume created and attached through the controller, connected with plain ``nvme connect`` on every
    portal; returns its head device."""
    csi.create(name, 256 * MiB)
    csi.attach(name)
    context = csi.ledger[name]["context"]
    for portal in context["portals"].split(","):
        trtype, addr, port = portal.split(":")
        subprocess.run(
            ["nvme", "connect", "-t", trtype, "-a", addr, "-s", port, "-n", context["nqn"]],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return find_head(context["namespaceUUID"])


def bare_release(csi: Csi, name: str) -> None:
    subprocess.run(
        ["nvme", "disconnect", "-n", csi.ledger[name]["context"]["nqn"]], check=True, capture_output=True, timeout=120
    )
    csi.detach(name)
    csi.delete(name)


def bare_ext4_file(device: str) -> str:
    """ext4 with the driver's mkfs options, mounted by hand, holding a written file of FIO_SIZE."""
    subprocess.run([*MKFS, device], check=True, capture_output=True, timeout=300)
    BARE_FS.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "ext4", device, str(BARE_FS)], check=True, capture_output=True, timeout=120)
    return str(write_probe_file(BARE_FS, int(FIO_SIZE[:-1])))  # made as in the published mount


def datapath(csi: Csi, seconds: float, rounds: int, jobs: Sequence[str] = tuple(JOBS)) -> dict[str, Any]:
    csi.up("dp-block", size=256 * MiB, mode="block")
    csi.up("dp-mount", size=256 * MiB, mode="mount", fs="ext4")
    raw_head = bare_connect(csi, "dp-raw")
    ext4_file = bare_ext4_file(bare_connect(csi, "dp-ext4"))
    targets = {
        "raw": raw_head,
        "block": csi.ledger["dp-block"]["target"],
        "mount": csi.probe_target("dp-mount", mib=int(FIO_SIZE[:-1]))["path"],
        "ext4": ext4_file,
        "raw-again": raw_head,
    }
    for target in ("raw", "block"):  # the files are written when made
        fio(targets[target], "write-128k", 0, once=True)
    iops: dict[str, dict[str, list[float]]] = {t: {j: [] for j in jobs} for t in targets}
    for r in range(rounds):
        order = list(targets) if r % 2 == 0 else list(reversed(targets))
        for job in jobs:
            for target in order:
                iops[target][job].append(fio(targets[target], job, seconds))
    subprocess.run(["umount", str(BARE_FS)], check=True, capture_output=True, timeout=120)
    bare_release(csi, "dp-ext4")
    bare_release(csi, "dp-raw")
    csi.down("dp-block")
    csi.down("dp-mount")
    mean = {t: {j: statistics.median(v) for j, v in jobs.items()} for t, jobs in iops.items()}
    ratios = {t: {j: round(mean[t][j] / mean["raw"][j], 3) for j in jobs} for t in ("block", "mount", "ext4")}
    noise = {j: round(mean["raw-again"][j] / mean["raw"][j], 3) for j in jobs}
    own = {j: round(mean["mount"][j] / mean["ext4"][j], 3) for j in jobs}
    return {
        "seconds": seconds,
        "rounds": rounds,
        "iops": {t: {j: round(v, 1) for j, v in jobs.items()} for t, jobs in mean.items()},
        "ratio": ratios,
        "worst_ratio": min(*ratios["block"].values(), *ratios["mount"].values()),
        "mount_vs_ext4": own,
        "worst_mount_vs_ext4": min(own.values()),
        "aa_ratio": noise,
        "aa_spread": round(max(abs(v - 1) for v in noise.values()), 3),
    }


class OtherControllers:
    """Subsystems made with raw configfs writes (a small backing file each, this host allowed, linked to a
    port) and connected with one write to ``/dev/nvme-fabrics`` each: no nvme-cli scan."""

    def __init__(self, hostnqn: str, hostid: str, port: str, traddr: str, trsvcid: str) -> None:
        self.hostnqn, self.hostid, self.port, self.traddr, self.trsvcid = hostnqn, hostid, port, traddr, trsvcid
        self.made: list[str] = []
        self.controllers: list[str] = []
        self.host_made = False

    def grow_to(self, count: int) -> float:
        """Connect more controllers until ``count`` are connected; returns the seconds it took."""
        begin = time.monotonic()
        OTHER_POOL.mkdir(parents=True, exist_ok=True)
        host = CFS / "hosts" / self.hostnqn
        if not host.exists():
            host.mkdir()
            self.host_made = True
        while len(self.made) < count:
            nqn = OTHER_NQN.format(uuid.uuid4())
            image = OTHER_POOL / f"{nqn.rsplit(':', 1)[1]}.img"
            with open(image, "wb") as handle:
                os.ftruncate(handle.fileno(), 16 * MiB)
            sub = CFS / "subsystems" / nqn
            sub.mkdir()
            (sub / "allowed_hosts" / self.hostnqn).symlink_to(host)
            ns = sub / "namespaces" / "1"
            ns.mkdir()
            (ns / "device_path").write_text(str(image))
            (ns / "enable").write_text("1")
            (CFS / "ports" / self.port / "subsystems" / nqn).symlink_to(sub)
            self.made.append(nqn)
            fd = os.open("/dev/nvme-fabrics", os.O_RDWR)
            try:
                os.write(
                    fd,
                    f"nqn={nqn},transport=tcp,traddr={self.traddr},trsvcid={self.trsvcid},"
                    f"hostnqn={self.hostnqn},hostid={self.hostid}".encode(),
                )
                self.controllers.append(os.read(fd, 256).decode().split(",")[0].split("=")[1])
            finally:
                os.close(fd)
        return time.monotonic() - begin

    def remove(self) -> None:
        for name in self.controllers:
            Path(f"/sys/class/nvme/nvme{name}/delete_controller").write_text("1")
        for nqn in self.made:
            sub = CFS / "subsystems" / nqn
            (CFS / "ports" / self.port / "subsystems" / nqn).unlink()
            (sub / "namespaces" / "1" / "enable").write_text("0")
            (sub / "namespaces" / "1").rmdir()
            (sub / "allowed_hosts" / self.hostnqn).unlink()
            sub.rmdir()
            (OTHER_POOL / f"{nqn.rsplit(':', 1)[1]}.img").unlink()
        if self.host_made:
            (CFS / "hosts" / self.hostnqn).rmdir()


def settle() -> None:
    """Wait for udev to finish the events of newly connected devices (when udev runs here) and for the page
    cache's dirty data (the data path's writes before) to be written, so neither is timed as a stage."""
    with contextlib.suppress(FileNotFoundError):
        subprocess.run(["udevadm", "settle", "--timeout=120"], check=False, capture_output=True, timeout=150)
    os.sync()
    time.sleep(1)


def stage_times(csi: Csi, rounds: int, tag: str) -> list[float]:
    """Seconds of NodeStage+NodePublish of a fresh volume, ``rounds`` times (create/attach and undo not timed)."""
    times = []
    for i in range(rounds):
        name = f"sc-{tag}-{i}"
        csi.create(name, 128 * MiB)
        csi.attach(name)
        begin = time.monotonic()
        csi.stage(name)
        csi.publish(name)
        times.append(time.monotonic() - begin)
        csi.down(name)
    return times


def scaling(csi: Csi, levels: list[int], rounds: int) -> dict[str, Any]:
    hostnqn = Path("/etc/nvme/hostnqn").read_text().strip()
    port = sorted(os.listdir(CFS / "ports"))[0]
    addr = CFS / "ports" / port
    hostid = Path("/etc/nvme/hostid").read_text().strip()  # the kernel refuses one host NQN with two host IDs
    others = OtherControllers(
        hostnqn, hostid, port, (addr / "addr_traddr").read_text().strip(), (addr / "addr_trsvcid").read_text().strip()
    )
    times: dict[str, list[float]] = {}
    connect_s: dict[str, float] = {}
    try:
        for level in sorted(levels):
            connect_s[str(level)] = round(others.grow_to(level), 2)
            settle()  # udev's work on the new devices is done before anything is timed
            stage_times(csi, 1, f"{level}-warm-up")  # not counted: the first stage after a change runs cold
            times[str(level)] = stage_times(csi, rounds, str(level))
    finally:
        others.remove()
    medians = {k: statistics.median(v) for k, v in times.items()}
    base = medians[str(min(levels))]
    return {
        "rounds": rounds,
        "stage_median_ms": {k: round(v * 1000, 1) for k, v in medians.items()},
        "stage_ms": {k: [round(t * 1000, 1) for t in v] for k, v in times.items()},
        "ratio": {k: round(v / base, 2) for k, v in medians.items()},
        "connect_seconds": connect_s,
    }


def node_resources(csi: Csi, pid: int, cycles: int) -> dict[str, Any]:
    csi.create("rss", 128 * MiB)
    csi.attach("rss")
    samples = [[0, *resources(pid)]]
    step = max(1, cycles // 20)
    for done in range(cycles):
        csi.stage("rss")
        csi.publish("rss")
        csi.unpublish("rss")
        csi.unstage("rss")
        if (done + 1) % step == 0:
            samples.append([done + 1, *resources(pid)])
    csi.detach("rss")
    csi.delete("rss")
    return {"cycles": cycles, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("socket")
    ap.add_argument("pid", type=int)
    ap.add_argument("--fio-seconds", type=float, default=4)
    ap.add_argument("--fio-rounds", type=int, default=8)
    ap.add_argument("--controllers", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--scale-rounds", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS), help="fio jobs of the data path")
    a = ap.parse_args()
    csi = Csi(a.socket)
    result = {
        "datapath": datapath(csi, a.fio_seconds, a.fio_rounds, a.jobs),
        "scaling": scaling(csi, [0, *a.controllers], a.scale_rounds),
        "resources": node_resources(csi, a.pid, a.cycles),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

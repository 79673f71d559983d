"""Benchmark: how the agent's cost grows with the volumes it holds. One ``nvmeof-csi agent`` process on this host,
on a plain folder standing in for nvmet configfs (the kernel is not the point here: the agent's own state, scans
and records are), reached over its Unix socket through the real gRPC client. ``--lab`` runs the same in a lab VM
on the kernel's own nvmet configfs (every volume a real subsystem, namespace and port link) and writes
``results/bench-scale-agent-lab.json``: the levels there are what the kernel and TCG allow in minutes.

At each level (volumes already there: 0, 1,000, 10,000 by default) it measures
- CreateVolume and DeleteVolume of new volumes, one at a time: p50 and p99;
- one ListVolumes page (100 entries) at the start, in the middle and near the end of the listing;
- the agent's restart: process start to its first answer (state load + convergence), and its RSS then.

The levels are filled with creates through the same API (several clients at once). Writes
``results/bench-scale-agent.json``; the ratios are each level's p50 over the p50 at 0.

usage: python -m bench.scale_agent [--levels 0 1000 10000] [--samples 100] [--smoke] [--lab]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench.provision_guest import profile as spy
from bench.provision_scripts import CFS, contract_create, contract_delete, raw_create, raw_delete
from bench.results import in_one_vm, save
from lab.build import REPO
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import DriverError
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.rpc.endpoints import Endpoint

MiB = 1 << 20
PAGE = 100
FILL_CLIENTS = 4


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 1000, 10000], help="volumes already there")
    ap.add_argument("--samples", type=int, default=100, help="creates and deletes measured at each level")
    ap.add_argument("--smoke", action="store_true", help="CI: levels 0, 50, 200 with 10 samples; not a measurement")
    ap.add_argument(
        "--lab",
        action="store_true",
        help="boot a lab VM and measure there on the kernel's nvmet configfs (results/bench-scale-agent-lab.json)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="SECONDS",
        help="at each level, py-spy samples the agent over this many seconds of create+delete cycles: its CPU per "
        "cycle by part (bench/profile.py), to tell which part grows with the volumes held",
    )
    ap.add_argument(
        "--real-configfs",
        action="store_true",
        help="(what --lab runs in the VM) the kernel's nvmet configfs, modules loaded; prints the result as JSON",
    )
    return ap


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``, in the values' unit, rounded to 0.01."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def timed(call: Callable[[], Any]) -> float:
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


class AgentProcess:
    """``nvmeof-csi agent`` on a plain configfs tree under ``work``, or on the kernel's nvmet configfs with
    ``real``; :meth:`restart` keeps its state."""

    def __init__(self, work: Path, real: bool = False) -> None:
        self.work, self.real = work, real
        self.sock = work / "agent.sock"
        self.configfs = CFS if real else work / "nvmet"
        if not real:
            for sub in ("subsystems", "ports", "hosts"):
                (work / "nvmet" / sub).mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "nvmeof_csi", "agent", "--name", "scale",
            "--portal", "1:tcp:127.0.0.1:4420:a", "--portal", "2:tcp:127.0.0.2:4421:b",
            "--state-dir", str(self.work / "state"), "--pool-dir", str(self.work / "pool"),
            "--listen-unix", f"unix://{self.sock}", "--configfs-root", str(self.configfs),
            *(() if self.real else ("--configfs-plain-tree",)), "--log-level", "WARNING",
        ]  # fmt: skip

    def start(self) -> float:
        """Start and wait for the first answer to Health; the seconds that took."""
        self.sock.unlink(missing_ok=True)
        began = time.monotonic()
        with open(self.work / "agent.log", "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        with self.client(timeout=2) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.work / "agent.log").read_text()[-3000:])
                try:
                    if self.sock.exists() and client.health().ready:
                        return time.monotonic() - began
                except DriverError:
                    pass
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
            self.proc = None

    def rss_kib(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def client(self, timeout: float = 60) -> AgentClient:
        return AgentClient(AgentTarget("scale", Endpoint.parse(f"unix://{self.sock}")), timeout=timeout)


@contextmanager
def running_agent(real: bool = False) -> Iterator[AgentProcess]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir="/var/tmp") as work:
        agent = AgentProcess(Path(work), real)
        agent.start()
        try:
            yield agent
        finally:
            agent.stop()


def fill(agent: AgentProcess, start: int, stop: int) -> None:
    """Volumes ``fill-<start>`` .. ``fill-<stop - 1>`` of 1 MiB, created by several clients at once."""
    if stop <= start:
        return
    with agent.client() as client, ThreadPoolExecutor(FILL_CLIENTS) as pool:
        list(pool.map(lambda i: client.create_volume(f"fill-{i}", MiB), range(start, stop)))


def page_cost(client: AgentClient, tokens: Sequence[str]) -> dict[str, float]:
    """Milliseconds of one ListVolumes page after each of ``tokens`` (median of 5 calls each)."""
    out = {}
    for where, token in zip(("start", "middle", "end"), tokens, strict=False):
        request = pb.ListVolumesRequest(max_entries=PAGE, starting_token=token)
        out[where] = round(statistics.median(timed(partial(client.list_page, request)) for _ in range(5)), 2)
    return out


def bare_configfs(agent: AgentProcess, samples: int) -> dict[str, float]:
    """On real configfs: the durable raw configfs script's create and delete (bench/provision_scripts.py: the
    same kernel objects and durability, no agent) and the contract script's (every system call the agent makes,
    in its order) beside the agent's, p50 in ms: what the kernel's own cost does as the volumes held grow."""
    pool = agent.work / "raw"
    (pool / "records").mkdir(parents=True, exist_ok=True)
    ports = ["1", "2"]  # the agent's portals (argv)
    creates, deletes, c_creates, c_deletes = [], [], [], []
    for _ in range(samples):
        made: list[str] = []
        creates.append(timed(lambda: made.append(raw_create(pool, ports, durable=True))))  # noqa: B023 - at once
        deletes.append(timed(lambda: raw_delete(pool, ports, made[0], durable=True)))  # noqa: B023 - at once
        # the contract script: every system call the agent makes, in its order (more lookups in the same dirs)
        c_creates.append(timed(lambda: made.append(contract_create(pool, ports))))  # noqa: B023 - at once
        c_deletes.append(timed(lambda: contract_delete(pool, ports, made[1])))  # noqa: B023 - at once
    return {
        "raw_create_p50_ms": quantile(creates, 0.5),
        "raw_delete_p50_ms": quantile(deletes, 0.5),
        "contract_create_p50_ms": quantile(c_creates, 0.5),
        "contract_delete_p50_ms": quantile(c_deletes, 0.5),
    }


def cpu_by_part(client: AgentClient, pid: int, seconds: int) -> dict[str, Any]:
    """py-spy over ``seconds`` of create+delete cycles (bench/provision_guest.py): the agent's CPU ms per cycle,
    and that split by part (each part's share of the samples times the CPU)."""
    found = spy(client, pid, seconds)
    cpu = float(found["agent_cpu_ms_per_cycle"])  # type: ignore[arg-type]
    shares: dict[str, float] = found["share"]  # type: ignore[assignment]
    return {**found, "cpu_ms_by_part": {part: round(share * cpu, 2) for part, share in shares.items()}}


def measure(agent: AgentProcess, level: int, samples: int, profile_s: int = 0) -> dict[str, Any]:
    bare: dict[str, Any] = {**bare_configfs(agent, samples)} if agent.real else {}
    with agent.client() as client:
        if profile_s and agent.proc is not None:
            bare["profile"] = cpu_by_part(client, agent.proc.pid, profile_s)
        creates, deletes = [], []
        for i in range(samples):
            name = f"probe-{level}-{i}"
            made: list[pb.Volume] = []
            creates.append(timed(lambda: made.append(client.create_volume(name, MiB))))  # noqa: B023 - called at once
            deletes.append(timed(lambda: client.delete_volume(made[0].uuid)))  # noqa: B023 - called at once
        uuids = sorted(v.uuid for v in client.list_volumes())
        tokens = ["", *(uuids[int(len(uuids) * f)] for f in (0.5, 0.95) if uuids)]
        pages = page_cost(client, tokens)
    agent.stop()
    start_s = agent.start()
    return {
        "volumes": level,
        "create_p50_ms": quantile(creates, 0.5),
        "create_p99_ms": quantile(creates, 0.99),
        "delete_p50_ms": quantile(deletes, 0.5),
        "delete_p99_ms": quantile(deletes, 0.99),
        "list_page_ms": pages,
        "start_s": round(start_s, 3),
        "rss_kib": agent.rss_kib(),
        **bare,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels, samples = ([0, 50, 200], 10) if args.smoke else (sorted(args.levels), args.samples)
    rows: list[dict[str, Any]] = []
    with running_agent(args.real_configfs) as agent:
        there = 0
        for level in levels:
            began = time.monotonic()
            fill(agent, there, level)
            os.sync()  # the fill's writeback is not the measured calls' cost
            there = level
            row = measure(agent, level, samples, 0 if args.smoke else args.profile)
            row["fill_s"] = round(time.monotonic() - began, 1)
            rows.append(row)
            print(f"bench scale-agent: {row}", file=sys.stderr if args.real_configfs else sys.stdout, flush=True)
    base, top = rows[0], rows[-1]
    per_volume = (top["rss_kib"] - base["rss_kib"]) / max(1, top["volumes"] - base["volumes"])
    start_growth = (top["start_s"] - base["start_s"]) / max(1, top["volumes"] - base["volumes"])
    return {
        "smoke": args.smoke,
        "samples": samples,
        "levels": rows,
        "create_p50_ratio": round(top["create_p50_ms"] / base["create_p50_ms"], 2),
        "delete_p50_ratio": round(top["delete_p50_ms"] / base["delete_p50_ms"], 2),
        "list_page_ratio": round(max(top["list_page_ms"].values()) / rows[1]["list_page_ms"]["start"], 2)
        if len(rows) > 1
        else 1.0,
        "rss_kib_per_volume": round(per_volume, 2),
        "start_ms_per_volume": round(start_growth * 1000, 4),
        **profile_growth(base, top),
        **(
            {
                "raw_create_p50_ratio": round(top["raw_create_p50_ms"] / base["raw_create_p50_ms"], 2),
                "raw_delete_p50_ratio": round(top["raw_delete_p50_ms"] / base["raw_delete_p50_ms"], 2),
                "contract_create_p50_ratio": round(top["contract_create_p50_ms"] / base["contract_create_p50_ms"], 2),
                "contract_delete_p50_ratio": round(top["contract_delete_p50_ms"] / base["contract_delete_p50_ms"], 2),
                # the agent above its own system calls (agent minus the contract script): what is the agent's
                "own_create_p50_ratio": round(
                    (top["create_p50_ms"] - top["contract_create_p50_ms"])
                    / (base["create_p50_ms"] - base["contract_create_p50_ms"]),
                    2,
                ),
            }
            if "raw_create_p50_ms" in top
            else {}
        ),
    }


def profile_growth(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """With a profile at both ends: how much of the agent's CPU per create+delete cycle each part added."""
    if "profile" not in base or "profile" not in top:
        return {}
    low, high = base["profile"]["cpu_ms_by_part"], top["profile"]["cpu_ms_by_part"]
    return {"cpu_ms_growth_by_part": {part: round(high[part] - low[part], 2) for part in high}}


def in_lab(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark with ``--real-configfs`` in a booted lab VM (NVMe-oF modules loaded), its result with the
    kernel it ran on."""
    levels = ["--smoke"] if args.smoke else ["--levels", *map(str, args.levels), "--samples", str(args.samples)]
    levels += ["--profile", str(args.profile)] if args.profile and not args.smoke else []
    with in_one_vm() as vm:
        # the VM's root is a 1 GiB tmpfs: the volumes' sparse 1 MiB images go on a tmpfs whose size is room to
        # provision (the agent refuses what its pool's filesystem cannot hold), not memory they use
        vm.check(["mount", "-t", "tmpfs", "-o", "size=64g", "bench-scale", "/var/tmp"])
        out = vm.check([vm.python, "-m", "bench.scale_agent", "--real-configfs", *levels], timeout=7200, cwd=str(REPO))
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result.update(kernel=vm.ready["kernel"], accel=vm.accel, configfs="nvmet")
    return result


def run_and_report(args: argparse.Namespace) -> None:
    if args.real_configfs:
        print(json.dumps(run(args)))
        return
    result = in_lab(args) if args.lab else run(args)
    save("scale-agent-lab" if args.lab else "scale-agent", result)
    top = result["levels"][-1]
    print(
        f"bench scale-agent: at {top['volumes']} volumes vs 0: create p50 {result['create_p50_ratio']}x, delete p50 "
        f"{result['delete_p50_ratio']}x (goal 1.2x); ListVolumes page at {top['volumes']} "
        f"{top['list_page_ms']} ms ({result['list_page_ratio']}x the smallest listing's); start-up "
        f"{top['start_s']} s (+{result['start_ms_per_volume']} ms per volume); RSS {top['rss_kib']} KiB "
        f"({result['rss_kib_per_volume']} KiB per volume)"
    )
    if "cpu_ms_growth_by_part" in result:
        grew = sorted(result["cpu_ms_growth_by_part"].items(), key=lambda kv: -abs(kv[1]))
        print(
            "bench scale-agent: agent CPU per create+delete added, by part: "
            + ", ".join(f"{k} {v:+} ms" for k, v in grew)
        )


def main() -> None:
    run_and_report(parser().parse_args())


if __name__ == "__main__":
    main()

"""Benchmark: CreateVolume through the controller as the fleet of agents grows. ``nvmeof-csi serve --mode
controller`` on this host with a fabric map of N agent processes (plain configfs folders, ``bench/scale_agent.py``),
one fabric, driven over its CSI socket as the external-provisioner drives it (CreateVolume, then DeleteVolume),
at its default log level, once its name census is complete (``fleet/census.py``).

Every agent of the largest fleet runs throughout (so the machine carries the same processes at every size: the
controller's cost is what changes); at each fleet size (1, 8, 64 agents in the map by default) it measures
CreateVolume and DeleteVolume p50/p99 of one volume at a time, next to the baseline: the agent calls one create
makes, sent straight to the agents without a controller (:func:`direct`); at the largest it then kills one agent
(SIGKILL) and measures again: the first creates after the loss (which may probe the dead agent), the p50 of the
rest, and how many creates were refused UNAVAILABLE (a name whose home is the dead agent waits for it: about 1/N
of new names). Writes ``results/bench-scale-controller.json``.

usage: python -m bench.scale_controller [--agents 1 8 64] [--samples 60] [--smoke]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc

from bench.results import save
from bench.scale_agent import AgentProcess, quantile, timed
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc

GiB = 1 << 30


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 8, 64], help="fleet sizes")
    ap.add_argument("--samples", type=int, default=60, help="creates and deletes measured at each size")
    ap.add_argument("--smoke", action="store_true", help="CI: fleets of 1 and 4, 6 samples; not a measurement")
    return ap


@contextmanager
def controller(work: Path, agents: list[AgentProcess]) -> Iterator[csi_pb2_grpc.ControllerStub]:
    """The controller process over ``agents``; its CSI Controller stub."""
    fabric = work / "fabric.yaml"
    fabric.write_text(
        "agents:\n"
        + "".join(f"  - {{name: a{i}, endpoint: 'unix://{a.sock}', fabric: f1}}\n" for i, a in enumerate(agents))
    )
    sock = work / "controller.sock"
    sock.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "nvmeof_csi", "serve", "--mode", "controller", "--backend", "nvmeof",
        "--fabric-map", str(fabric), "--endpoint", f"unix://{sock}",
    ]  # fmt: skip
    log_file = work / "controller.log"
    log_file.unlink(missing_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (sock.exists() and "name census complete" in log_file.read_text()):  # placement as it runs
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log_file.read_text()[-3000:])
            time.sleep(0.05)
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            yield csi_pb2_grpc.ControllerStub(channel)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def request(name: str) -> csi_pb2.CreateVolumeRequest:
    mount = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER),
    )
    return csi_pb2.CreateVolumeRequest(
        name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=1 << 20), volume_capabilities=[mount]
    )


def cycles(
    stub: csi_pb2_grpc.ControllerStub, tag: str, samples: int, refused: list[str] | None = None
) -> tuple[list[float], list[float]]:
    """Milliseconds of ``samples`` CreateVolume and DeleteVolume calls, one volume at a time. With ``refused``, a
    create that fails UNAVAILABLE is recorded there (its name) and not timed, instead of raised."""
    creates, deletes = [], []
    for i in range(samples):
        made: list[csi_pb2.CreateVolumeResponse] = []
        try:
            took = timed(lambda: made.append(stub.CreateVolume(request(f"{tag}-{i}"), timeout=120)))  # noqa: B023
        except grpc.RpcError as err:
            if refused is None or err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            refused.append(f"{tag}-{i}")
            continue
        creates.append(took)
        volume_id = made[0].volume.volume_id
        deletes.append(timed(lambda: stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id))))  # noqa: B023
    return creates, deletes


def direct(agents: list[AgentProcess], tag: str, samples: int) -> list[float]:
    """The baseline: milliseconds of the agent calls one CreateVolume makes, sent straight to the agents with no
    controller (LookupName and ReserveName at the name's home, CreateVolume on another agent when there is one),
    each volume then deleted untimed. Whatever grows here with the agents is the machine's (more processes, colder
    caches), not the controller's."""
    clients = [a.client() for a in agents]
    took = []
    try:
        for i in range(samples):
            name = f"{tag}-{i}"
            home, placed = clients[i % len(clients)], clients[(i + 1) % len(clients)]
            began = time.perf_counter()
            home.lookup_name(name)
            home.reserve_name(name, str(uuid.uuid4()), "placed")
            vol = placed.create_volume(name, 1 << 20)
            took.append((time.perf_counter() - began) * 1000)
            home.release_name(name, vol.uuid)
            placed.delete_volume(vol.uuid)
    finally:
        for client in clients:
            client.close()
    return took


def row(size: int, creates: list[float], deletes: list[float]) -> dict[str, Any]:
    if not creates or not deletes:
        raise RuntimeError(f"no create succeeded with {size} agents")
    return {
        "agents": size,
        "create_p50_ms": quantile(creates, 0.5),
        "create_p99_ms": quantile(creates, 0.99),
        "delete_p50_ms": quantile(deletes, 0.5),
        "delete_p99_ms": quantile(deletes, 0.99),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes, samples = ([1, 4], 8) if args.smoke else (sorted(args.agents), args.samples)
    rows, dead = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-ctrl-", dir="/var/tmp") as tmp, ExitStack() as stack:
        work, agents = Path(tmp), list[AgentProcess]()
        began = time.monotonic()
        for i in range(sizes[-1]):  # every agent runs through every size: the machine's load is the same
            agents.append(AgentProcess(work / f"a{i}"))
            agents[-1].start()
            stack.callback(agents[-1].stop)
        start_s = time.monotonic() - began
        for size in sizes:
            direct(agents[:size], f"warm-direct-{size}", 10)
            bare = quantile(direct(agents[:size], f"direct-{size}", samples), 0.5)
            with controller(work, agents[:size]) as stub:
                cycles(stub, f"warm-{size}", 10)
                rows.append({**row(size, *cycles(stub, f"v{size}", samples)), "direct_create_p50_ms": bare})
                print(f"bench scale-controller: {rows[-1]}", flush=True)
                if size == sizes[-1] and size > 1:
                    victim = agents[-1]
                    assert victim.proc is not None
                    victim.proc.kill()
                    refused: list[str] = []
                    creates, deletes = cycles(stub, "dead", samples, refused)
                    dead = {
                        **row(size, creates[3:] if len(creates) > 3 else creates, deletes),
                        "first_creates_ms": [round(c, 1) for c in creates[:3]],
                        "refused_unavailable": len(refused),
                        "tried": samples,
                    }
                    print(f"bench scale-controller: one agent dead: {dead}", flush=True)
    base, top = rows[0], rows[-1]
    return {
        "smoke": args.smoke,
        "samples": samples,
        "fleets": rows,
        "agents_start_s": round(start_s, 1),
        "create_p50_ratio": round(top["create_p50_ms"] / base["create_p50_ms"], 2),
        "direct_create_p50_ratio": round(top["direct_create_p50_ms"] / base["direct_create_p50_ms"], 2),
        # the controller's own growth: its ratio over the bare calls' ratio (1.0: it adds nothing per agent)
        "create_p50_ratio_over_direct": round(
            (top["create_p50_ms"] / base["create_p50_ms"])
            / (top["direct_create_p50_ms"] / base["direct_create_p50_ms"]),
            2,
        ),
        "one_dead": dead,
        "one_dead_create_p50_ratio": round(dead["create_p50_ms"] / top["create_p50_ms"], 2) if dead else None,
    }


def run_and_report(args: argparse.Namespace) -> None:
    result = run(args)
    save("scale-controller", result)
    top, dead = result["fleets"][-1], result["one_dead"]
    print(
        f"bench scale-controller: CreateVolume p50 with {top['agents']} agents {top['create_p50_ms']} ms = "
        f"{result['create_p50_ratio']}x with {result['fleets'][0]['agents']} (goal 1.2x); the same agent calls sent "
        f"straight to the agents {result['direct_create_p50_ratio']}x, so the controller's own growth is "
        f"{result['create_p50_ratio_over_direct']}x; one of "
        f"{top['agents']} dead: first creates {dead.get('first_creates_ms')} ms, then p50 "
        f"{dead.get('create_p50_ms')} ms ({result['one_dead_create_p50_ratio']}x all alive); refused UNAVAILABLE: "
        f"{dead.get('refused_unavailable')} of {dead.get('tried')} (names whose home is the dead agent, or placed on "
        "it before it was seen dead)"
    )


def main() -> None:
    run_and_report(parser().parse_args())


if __name__ == "__main__":
    main()

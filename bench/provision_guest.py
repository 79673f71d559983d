"""Guest half of bench/provision.py: alternate batches of creates+deletes through the target agent and
through a minimal raw sequence (the same configfs writes and file operations, no agent), timing each.
usage: python bench/provision_guest.py AGENT_SOCKET ROUNDS BATCH POOL_DIR; prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

from nvmeof_csi.agent.client import AgentClient, AgentTarget
from nvmeof_csi.rpc.endpoints import Endpoint

CFS = Path("/sys/kernel/config/nvmet")
SIZE = 64 << 20


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def raw_create(pool: Path, ports: list[str]) -> str:
    vol = str(uuid.uuid4())
    image = pool / f"raw-{vol}.img"
    with open(image, "wb") as f:
        os.ftruncate(f.fileno(), SIZE)
        os.fsync(f.fileno())
    sub = CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:raw:{vol}"
    sub.mkdir()
    _write(sub / "attr_allow_any_host", "0")
    ns = sub / "namespaces" / "1"
    ns.mkdir()
    _write(ns / "device_path", str(image))
    _write(ns / "device_uuid", vol)
    _write(ns / "enable", "1")
    for port in ports:
        (CFS / "ports" / port / "subsystems" / sub.name).symlink_to(sub)
    return vol


def raw_delete(pool: Path, ports: list[str], vol: str) -> None:
    sub = CFS / "subsystems" / f"nqn.2026-11.io.nvmeof:raw:{vol}"
    for port in ports:
        (CFS / "ports" / port / "subsystems" / sub.name).unlink()
    _write(sub / "namespaces" / "1" / "enable", "0")
    (sub / "namespaces" / "1").rmdir()
    sub.rmdir()
    (pool / f"raw-{vol}.img").unlink()


def main() -> None:
    sock, rounds, batch, pool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    ports = sorted(os.listdir(CFS / "ports"))
    pool.mkdir(parents=True, exist_ok=True)
    agent_t = {"create": 0.0, "delete": 0.0}
    raw_t = {"create": 0.0, "delete": 0.0}
    with AgentClient(AgentTarget("bench", Endpoint.parse(f"unix://{sock}")), 120) as client:
        client.health()
        for r in range(rounds):
            t = time.perf_counter()
            made = [client.create_volume(f"bench-{r}-{i}", SIZE).uuid for i in range(batch)]
            agent_t["create"] += time.perf_counter() - t
            t = time.perf_counter()
            for vol in made:
                client.delete_volume(vol)
            agent_t["delete"] += time.perf_counter() - t
            t = time.perf_counter()
            raw = [raw_create(pool, ports) for _ in range(batch)]
            raw_t["create"] += time.perf_counter() - t
            t = time.perf_counter()
            for vol in raw:
                raw_delete(pool, ports, vol)
            raw_t["delete"] += time.perf_counter() - t
    n = rounds * batch
    print(json.dumps({
        "operations_each": n,
        "agent_ms_per_create": round(agent_t["create"] / n * 1000, 2),
        "agent_ms_per_delete": round(agent_t["delete"] / n * 1000, 2),
        "raw_ms_per_create": round(raw_t["create"] / n * 1000, 2),
        "raw_ms_per_delete": round(raw_t["delete"] / n * 1000, 2),
        "ratio_create": round(agent_t["create"] / raw_t["create"], 2),
        "ratio_delete": round(agent_t["delete"] / raw_t["delete"], 2),
        "ratio_total": round(sum(agent_t.values()) / sum(raw_t.values()), 2),
    }))


if __name__ == "__main__":
    main()

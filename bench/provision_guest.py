"""Guest half of bench/provision.py; prints one JSON line.

usage: python -m bench.provision_guest AGENT_SOCKET ROUNDS BATCH POOL_DIR AGENT_PID CONCURRENCY CYCLES PROFILE_S
       REPEATS

1. Latency: alternate batches of creates+deletes through the target agent and through three scripts
   (bench/provision_scripts.py: configfs writes and file operations, no agent): ``bare`` (only the image
   fsynced), ``durable`` (the agent's durability in the fewest steps) and ``contract`` (every system call the
   agent makes, in its order), timing each.
2. Throughput: the same create+delete cycles from CONCURRENCY clients at once vs. one client, and the durable
   script's own ceiling on this machine: CONCURRENCY processes at once vs. one; REPEATS rounds of the four,
   alternated, medians reported with each round's share of the ceiling.
3. The RPC floor: an empty round trip (Health) through the same connection, its wall time and the agent's CPU;
   and the same round trip to a server that does nothing at all (bench/grpc_floor.py): the least any agent
   served over gRPC in Python costs per call on this machine.
4. Profile: PROFILE_S seconds of create+delete cycles from one client while py-spy samples the agent
   (bench/profile.py): the agent's CPU per cycle split by what it was doing.
5. Resources: CYCLES create+delete cycles while the agent's RSS and open file descriptors are sampled.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.profile import categorise, leaves, record
from bench.provision_scripts import CFS, SIZE, contract_create, contract_delete, raw_create, raw_delete
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.rpc.endpoints import Endpoint


def resources(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of process ``pid``."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cycles_through(client: AgentClient, prefix: str, count: int) -> None:
    for i in range(count):
        client.delete_volume(client.create_volume(f"{prefix}-{i}", SIZE).uuid)


def throughput(connect: Callable[[], AgentClient], clients: int, per_client: int, pid: int) -> tuple[float, float]:
    """(create+delete cycles per second, agent CPU ms per cycle) with ``clients`` clients, each on its own
    connection."""
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with connect() as client:
                cycles_through(client, f"tp{clients}-{n}", per_client)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(clients)]
    cpu = cpu_seconds(pid)
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - begin, cpu_seconds(pid) - cpu
    if errors:
        raise errors[0]
    return clients * per_client / wall, cpu / (clients * per_client) * 1000


def _script_cycles(pool: Path, ports: list[str], count: int) -> None:
    for _ in range(count):
        raw_delete(pool, ports, raw_create(pool, ports, durable=True), durable=True)


def script_throughput(pool: Path, ports: list[str], workers: int, per_worker: int) -> float:
    """Durable-script create+delete cycles per second with ``workers`` processes at once (no GIL, no lock:
    what the machine itself allows)."""
    procs = [multiprocessing.Process(target=_script_cycles, args=(pool, ports, per_worker)) for _ in range(workers)]
    begin = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        raise SystemExit("bench provision: a script process failed")
    return workers * per_worker / (time.perf_counter() - begin)


def throughput_runs(
    connect: Callable[[], AgentClient], pool: Path, ports: list[str], pid: int, concurrency: int, repeats: int
) -> list[tuple[float, float, float, float, float, float]]:
    """``repeats`` rounds, each: the agent with 1 client, with ``concurrency`` clients, then the durable script
    with 1 and with ``concurrency`` processes, every run the same ``concurrency * 4`` cycles; alternated so that a
    slower minute of the host falls on both. Each round: (agent cycles/s with 1, agent CPU ms per cycle with 1,
    the same with ``concurrency``, script cycles/s with 1, script cycles/s with ``concurrency``)."""
    runs = []
    for _ in range(repeats):
        one, cpu_one = throughput(connect, 1, concurrency * 4, pid)
        many, cpu_many = throughput(connect, concurrency, 4, pid)
        script_one = script_throughput(pool, ports, 1, concurrency * 4)
        script_many = script_throughput(pool, ports, concurrency, 4)
        runs.append((one, cpu_one, many, cpu_many, script_one, script_many))
    return runs


def rpc_floor(client: AgentClient, pid: int, calls: int = 200) -> tuple[float, float]:
    """(ms per empty round trip, agent CPU ms per round trip): Health crosses the same edge, thread hop and
    transport as a create, and does nothing else."""
    cpu, begin = cpu_seconds(pid), time.perf_counter()
    for _ in range(calls):
        client.health()
    return (time.perf_counter() - begin) / calls * 1000, (cpu_seconds(pid) - cpu) / calls * 1000


def bare_grpc_floor(calls: int = 200) -> tuple[float, float]:
    """(ms per round trip, server CPU ms per round trip) to bench/grpc_floor.py on a unix socket."""
    sock = Path(f"/run/nvmeof-csi-bench-floor-{os.getpid()}.sock")
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("grpc_floor.py")), str(sock)])
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("bench provision: the bare gRPC server did not start")
            time.sleep(0.1)
        with AgentClient(AgentTarget("floor", Endpoint.parse(f"unix://{sock}")), 60) as client:
            client.health()
            return rpc_floor(client, server.pid, calls)
    finally:
        server.kill()
        server.wait()
        sock.unlink(missing_ok=True)


def profile(client: AgentClient, pid: int, seconds: int) -> dict[str, object]:
    """What the agent was busy with (bench/profile.py: shares of py-spy's samples by category, the innermost
    frames) over ``seconds`` of create+delete cycles from one client, with its CPU and wall time per cycle."""
    made = iter(range(1 << 30))
    cpu, begin = cpu_seconds(pid), time.perf_counter()
    raw, cycles = record(
        pid,
        seconds,
        Path(f"/tmp/bench-profile-{os.getpid()}.txt"),
        lambda: cycles_through(client, f"prof-{next(made)}", 1),
    )
    cycles = max(cycles, 1)
    cpu_ms, wall_ms = (cpu_seconds(pid) - cpu) / cycles * 1000, (time.perf_counter() - begin) / cycles * 1000
    shares, pathlib, samples = categorise(raw)
    return {
        "seconds": seconds,
        "cycles": cycles,
        "samples": samples,
        "agent_cpu_ms_per_cycle": round(cpu_ms, 1),
        "wall_ms_per_cycle": round(wall_ms, 1),
        "share": shares,
        "pathlib_share": pathlib,
        "top_leaves": leaves(raw),
    }


def timed_batch(
    totals: dict[str, float], batch: int, create: Callable[[int], str], delete: Callable[[str], None]
) -> None:
    """``batch`` creates, then their deletes, each phase's seconds added to ``totals``."""
    begin = time.perf_counter()
    made = [create(i) for i in range(batch)]
    totals["create"] += time.perf_counter() - begin
    begin = time.perf_counter()
    for vol in made:
        delete(vol)
    totals["delete"] += time.perf_counter() - begin


def main() -> None:
    sock, rounds, batch, pool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    pid, concurrency, cycles, profile_s = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
    repeats = int(sys.argv[9])
    ports = sorted(os.listdir(CFS / "ports"))
    (pool / "records").mkdir(parents=True, exist_ok=True)
    agent_t = {"create": 0.0, "delete": 0.0}
    raw_t = {"create": 0.0, "delete": 0.0}
    durable_t = {"create": 0.0, "delete": 0.0}
    contract_t = {"create": 0.0, "delete": 0.0}

    def connect() -> AgentClient:
        return AgentClient(AgentTarget("bench", Endpoint.parse(f"unix://{sock}")), 120)

    with connect() as client:
        client.health()
        for r in range(rounds):

            def agent_create(i: int, r: int = r) -> str:
                return client.create_volume(f"bench-{r}-{i}", SIZE).uuid

            timed_batch(agent_t, batch, agent_create, client.delete_volume)
            timed_batch(raw_t, batch, lambda _: raw_create(pool, ports), lambda vol: raw_delete(pool, ports, vol))
            timed_batch(
                durable_t,
                batch,
                lambda _: raw_create(pool, ports, durable=True),
                lambda vol: raw_delete(pool, ports, vol, durable=True),
            )
            timed_batch(
                contract_t, batch, lambda _: contract_create(pool, ports), lambda vol: contract_delete(pool, ports, vol)
            )
        runs = throughput_runs(connect, pool, ports, pid, concurrency, repeats)
        one, cpu_one, many, cpu_many, script_one, script_many = (
            statistics.median(run[k] for run in runs) for k in range(6)
        )
        shares = [run[2] / run[0] / (run[5] / run[4]) for run in runs]
        floor_ms, floor_cpu_ms = rpc_floor(client, pid)
        bare_ms, bare_cpu_ms = bare_grpc_floor()
        where = profile(client, pid, profile_s)
        samples: list[list[int]] = [[0, *resources(pid)]]
        step = max(1, cycles // 20)
        for done in range(0, cycles, step):
            cycles_through(client, f"rss-{done}", min(step, cycles - done))
            samples.append([min(done + step, cycles), *resources(pid)])
    n = rounds * batch
    print(
        json.dumps(
            {
                "operations_each": n,
                "agent_ms_per_create": round(agent_t["create"] / n * 1000, 2),
                "agent_ms_per_delete": round(agent_t["delete"] / n * 1000, 2),
                "raw_ms_per_create": round(raw_t["create"] / n * 1000, 2),
                "raw_ms_per_delete": round(raw_t["delete"] / n * 1000, 2),
                "ratio_create": round(agent_t["create"] / raw_t["create"], 2),
                "ratio_delete": round(agent_t["delete"] / raw_t["delete"], 2),
                "ratio_total": round(sum(agent_t.values()) / sum(raw_t.values()), 2),
                "durable_ms_per_create": round(durable_t["create"] / n * 1000, 2),
                "durable_ms_per_delete": round(durable_t["delete"] / n * 1000, 2),
                "ratio_vs_durable": round(sum(agent_t.values()) / sum(durable_t.values()), 2),
                "concurrency": concurrency,
                "cycles_per_s_1": round(one, 2),
                "cycles_per_s_n": round(many, 2),
                "concurrency_speedup": round(many / one, 2),
                "agent_cpu_ms_per_cycle_1": round(cpu_one, 1),
                "agent_cpu_ms_per_cycle_n": round(cpu_many, 1),
                "wall_ms_per_cycle_1": round(1000 / one, 1),
                "guest_cpus": os.cpu_count(),
                "script_cycles_per_s_1": round(script_one, 2),
                "script_cycles_per_s_n": round(script_many, 2),
                "script_concurrency_speedup": round(script_many / script_one, 2),
                # each round's share of the ceiling, (agent n / agent 1) / (script n / script 1), and their median:
                # the four runs of a round share the host's minute
                "speedup_vs_script_ceiling": round(statistics.median(shares), 2),
                "throughput_repeats": repeats,
                "ceiling_share_runs": [round(share, 2) for share in shares],
                "rpc_floor_ms": round(floor_ms, 2),
                "rpc_floor_agent_cpu_ms": round(floor_cpu_ms, 2),
                "bare_grpc_ms": round(bare_ms, 2),
                "bare_grpc_server_cpu_ms": round(bare_cpu_ms, 2),
                # the durable script plus one bare round trip per create and delete
                "ratio_floor_any_grpc_agent": round(
                    (sum(durable_t.values()) + 2 * n * bare_ms / 1000) / sum(durable_t.values()), 2
                ),
                "contract_ms_per_create": round(contract_t["create"] / n * 1000, 2),
                "contract_ms_per_delete": round(contract_t["delete"] / n * 1000, 2),
                "ratio_contract_vs_durable": round(sum(contract_t.values()) / sum(durable_t.values()), 2),
                "ratio_floor_contract_grpc": round(  # the agent's own system calls plus a bare round trip per call
                    (sum(contract_t.values()) + 2 * n * bare_ms / 1000) / sum(durable_t.values()), 2
                ),
                "ratio_agent_vs_contract_grpc": round(
                    sum(agent_t.values()) / (sum(contract_t.values()) + 2 * n * bare_ms / 1000), 2
                ),
                "profile": where,
                "resource_cycles": cycles,
                "resources": samples,
            }
        )
    )


if __name__ == "__main__":
    main()

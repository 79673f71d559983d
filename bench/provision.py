"""Benchmark: 200 creates + 200 deletes through the target agent vs. a minimal script doing the same
configfs writes and file operations, alternated in batches in one lab VM run (TCG: compare the ratio, not
the absolute times). Writes results/bench-provision.json.

usage: python -m bench.provision [--rounds 8] [--batch 25]
"""

from __future__ import annotations

import argparse
import json
import time

from bench.results import save
from lab import Fabric, LabVM, Portal
from lab.build import REPO
from lab.target import POOL_DIR, GuestTargetAgent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batch", type=int, default=25)
    args = ap.parse_args()
    started = time.monotonic()
    with LabVM() as vm:
        Fabric(vm).load()
        agent = GuestTargetAgent(vm, [Portal(1, "tcp", "127.0.0.1", 4420), Portal(2, "tcp", "127.0.0.2", 4421)])
        agent.wipe()
        agent.start()
        out = vm.check(
            [vm.python, "bench/provision_guest.py", "/run/nvmeof-csi/agent.sock", str(args.rounds), str(args.batch),
             f"{POOL_DIR}-raw"],
            timeout=3600, cwd=str(REPO),
        )
        agent.stop()
    result = json.loads(out.strip().splitlines()[-1])
    result.update(kernel=vm.ready["kernel"], accel=vm.accel, wall_seconds=round(time.monotonic() - started, 1))
    save("provision", result)
    print(f"bench provision: agent {result['agent_ms_per_create']} ms/create {result['agent_ms_per_delete']} ms/delete"
          f" vs raw {result['raw_ms_per_create']} / {result['raw_ms_per_delete']} ms"
          f" -> ratio {result['ratio_total']}x ({result['operations_each']} each, {result['accel']})")


if __name__ == "__main__":
    main()

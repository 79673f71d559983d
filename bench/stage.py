"""Benchmark: NodeStage + NodePublish through the driver vs. the bare sequence a script would run (nvme
connect of the same portals, wait for the device, mkfs, mount, bind mount), alternated round by round in one
lab VM run (TCG: compare the ratio, not the absolute times). Writes results/bench-stage.json.

usage: python -m bench.stage [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import time

from bench.results import save
from lab import Fabric, LabVM
from lab.build import REPO
from lab.stack import DRIVER_SOCK, running_stack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    started = time.monotonic()
    with LabVM() as vm:
        Fabric(vm).load()
        with running_stack(vm, "WARNING"):
            out = vm.check([vm.python, "-m", "bench.stage_guest", DRIVER_SOCK, str(args.rounds)], timeout=3600,
                           cwd=str(REPO))
    result = json.loads(out.strip().splitlines()[-1])
    result.update(kernel=vm.ready["kernel"], accel=vm.accel, wall_seconds=round(time.monotonic() - started, 1))
    save("stage", result)
    print(f"bench stage: NodeStage+NodePublish median {result['csi_median_ms']} ms vs bare connect/mkfs/mount "
          f"{result['bare_median_ms']} ms -> ratio {result['ratio_median']}x ({args.rounds} rounds, {result['accel']})")


if __name__ == "__main__":
    main()

"""Benchmark: cold vs. warm hydration of the same data set into dataset volumes, through the real target-agent
logic (plain configfs tree, real backing files, mkfs.ext4 -d) and a real Alluxio 2.9 on loopback. Each round
frees the data set, hydrates volume A (cold: load jobs pull it from the under-store) and then volume B (warm:
every byte from the cache); rounds alternate in one run. Writes results/bench-dataset.json.

usage: python -m bench.dataset [--rounds 2] [--files 500] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from bench.results import save
from lab.alluxio import AlluxioCluster
from lab.dataset_files import make_dataset
from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.datasets.client import AlluxioRest, JobServiceLoader
from nvmeof_csi.datasets.fill import DatasetVolumes
from nvmeof_csi.datasets.hydrate import DatasetMetrics, Hydrator
from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.nvmeof.parameters import VolumeParameters

MiB = 1 << 20


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="cold + warm rounds")
    ap.add_argument("--files", type=int, default=500, help="files in the data set")
    ap.add_argument("--smoke", action="store_true", help="CI: one round of 20 files; not a measurement")
    return ap


def run(args: argparse.Namespace) -> None:
    """The benchmark on this host (a real Alluxio on loopback, no lab VM), saved and printed."""
    if args.smoke:
        args.rounds, args.files = 1, 20
    with tempfile.TemporaryDirectory(prefix="bench-dataset-") as tmp:
        base = Path(tmp)
        ds = make_dataset(base / "ufs-data", files=args.files, seed=17)
        with AlluxioCluster(base / "cluster", base / "root-ufs") as cluster:
            rest = AlluxioRest(cluster.proxy_url, cluster.job_url)
            agent = TargetAgent(
                name="bench",
                nvmet=Nvmet(base / "nvmet", plain_tree=True),
                store=FileStore(base / "pool"),
                state=StateStore(base / "state"),
                portals=[PortSpec(1, "tcp", "127.0.0.1", 4420, "a")],
                filler=DatasetVolumes(
                    Hydrator(
                        rest,
                        JobServiceLoader(rest),
                        Filesystems(SubprocessExecutor()),
                        DatasetMetrics(CollectorRegistry()),
                    ),
                    base / "pool" / ".hydrate",
                    (str(ds.root),),
                ),
            )
            agent.converge()  # prepares the pool, as the agent process does at start
            params = {"dataset.uri": str(ds.root), "dataset.path": "/datasets/bench-data", "dataset.pin": "false"}
            cold, warm, hit = [], [], []
            size = 2 * sum((ds.root / rel).stat().st_size for rel in ds.checksums) + 64 * MiB
            for r in range(args.rounds):
                if rest.exists("/datasets/bench-data"):  # cold again: free the cache and wait until it is really gone
                    rest.free("/datasets/bench-data")
                    deadline = time.monotonic() + 120
                    while any(f.in_alluxio_percentage for f in rest.files("/datasets/bench-data")):
                        if time.monotonic() > deadline:
                            raise SystemExit("bench dataset: Alluxio did not free the data set within 120 s")
                        time.sleep(1)
                times = []
                for name in (f"cold-{r}", f"warm-{r}"):
                    begin = time.monotonic()
                    view = agent.create_volume(name, size, VolumeParameters.parse(params), {})
                    times.append(time.monotonic() - begin)
                    hit.append(float(view.record.labels["dataset.hitRatio"]))
                cold.append(times[0])
                warm.append(times[1])
                for view in agent.list_volumes():
                    agent.delete_volume(view.record.uuid)
    result = {
        "smoke": args.smoke,
        "files": args.files,
        "rounds": args.rounds,
        "cold_s": [round(t, 2) for t in cold],
        "warm_s": [round(t, 2) for t in warm],
        "cold_median_s": round(statistics.median(cold), 2),
        "warm_median_s": round(statistics.median(warm), 2),
        "ratio_cold_over_warm": round(statistics.median(cold) / statistics.median(warm), 2),
        "hit_ratio_cold": hit[0::2],
        "hit_ratio_warm": hit[1::2],
    }
    save("dataset", result)
    print(
        f"bench dataset: {args.files} files; cold hydration median {result['cold_median_s']} s, warm "
        f"{result['warm_median_s']} s -> cold/warm {result['ratio_cold_over_warm']}x "
        f"(cache hit cold {result['hit_ratio_cold']}, warm {result['hit_ratio_warm']})"
    )


def main() -> None:
    run(parser().parse_args())


if __name__ == "__main__":
    main()

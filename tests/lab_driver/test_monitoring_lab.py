"""What an operator watches, proven against a real Prometheus in the lab VM: it scrapes the driver and the agent
while a pod does limited I/O on a volume and a path fails over; every panel of the Grafana dashboard answers
with data (dataset panels: in the alluxio tier, where hydration runs); our alert rules fire on the lost path
and resolve after it returns; the key panels are drawn to PNG in ``results/``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import Fabric
from lab.fabric import wait_until
from lab.pods import in_pod, make_pod, remove_pod
from lab.prometheus import GuestPrometheus, rules_text
from lab.stack import DRIVER_METRICS, GuestDriver
from lab.target import AGENT_METRICS, TWO_PORTALS
from tests.support.dashboard import DATASET_PANELS, has_data, panel_queries, render, slug

pytestmark = pytest.mark.lab
MiB = 1 << 20
P1 = TWO_PORTALS[0]
POD = "5b8e6a43-0c2d-4f1e-9a7b-3c4d5e6f7a8b"
RESULTS = Path(__file__).resolve().parents[2] / "results"
KEY_PANELS = (
    "IOPS",
    "Live paths vs portals",
    "ANA state per path",
    "Read IOPS: limit vs achieved",
    "Write IOPS: limit vs achieved",
    "RPC latency p50 / p99",
    "Pool used vs size",
    "Latency (mean per I/O)",
)
ALERT = "NvmeofCsiVolumePathDegraded"
HOLD = "12s"  # every rule's `for:` in this test's copy (3 evaluations at 4 s); shipped: 1m, checked by promtool
FIO_STOP = "/tmp/monitoring-fio.stop"


def polled(stack: GuestDriver, prom: GuestPrometheus, name: str) -> str:
    """Volume health through CSI (what kubernetes-csi's external-health-monitor calls periodically: the RPC
    panels need a steady flow of calls), then the alert's state."""
    stack.one("health", "mon")
    return alert_state(prom, name)


def alert_state(prom: GuestPrometheus, name: str) -> str:
    """'firing', 'pending' or '' for the alert ``name`` right now."""
    states = {a["state"] for a in prom.query()["alerts"] if a["labels"]["alertname"] == name}
    return "firing" if "firing" in states else ("pending" if states else "")


def test_prometheus_panels_answer_and_the_path_alert_fires_and_resolves(
    stack: GuestDriver, report: Callable[[str, str], None]
) -> None:
    vm, fabric = stack.vm, Fabric(stack.vm)
    pod = make_pod(vm, POD)
    # 4 s: a scrape may take its whole interval (the timeout) under TCG; a failed scrape makes the series stale
    # and restarts the alert's `for: 1m`
    # the shipped rules with every `for:` at HOLD: the same expressions fire and resolve without minutes of waiting
    prom = GuestPrometheus(
        vm,
        {"nvmeof-csi-node": DRIVER_METRICS, "nvmeof-csi-agent": AGENT_METRICS},
        interval="4s",
        rules=rules_text(HOLD),
    )
    report("prometheus ready", f"{prom.start():.1f}s")
    try:
        start = prom.now()
        steps = stack.csi(
            {
                "op": "up",
                "name": "mon",
                "size": 256 * MiB,
                "mode": "mount",
                "fs": "ext4",
                "params": {"readIops": "400", "writeIops": "300"},
                "pod": POD,
            }
        )
        nqn, target = steps[0]["nqn"], steps[0]["target"]
        fabric.wait_paths(nqn, live=2)
        vm.run(["rm", "-f", FIO_STOP])
        fio = vm.submit(
            in_pod(
                pod,
                [  # runs until the test writes FIO_STOP (600 s at most)
                    "fio",
                    "--name=mon",
                    f"--filename={target}/fio.dat",
                    "--size=32M",
                    "--rw=randrw",
                    "--bs=4k",
                    "--direct=1",
                    "--ioengine=psync",
                    "--time_based",
                    "--runtime=600",
                    f"--trigger-file={FIO_STOP}",
                    "--output-format=json",
                ],
            ),
            timeout=900,
        )
        time.sleep(20)
        lost = prom.now()
        fabric.unlink(P1.port_id, nqn)
        fired = wait_until(lambda: polled(stack, prom, ALERT) == "firing", 240, interval=3)
        fired_at = prom.now()
        report("path alert", f"{ALERT} firing {fired_at - lost:.0f}s after the path was lost (for: {HOLD})")
        assert fired, f"{ALERT} did not fire within 240 s of losing a path"
        assert fired_at - lost >= 12, "the alert fired before its `for:` held"
        fabric.link(P1.port_id, nqn)
        fabric.wait_paths(nqn, live=2, timeout=60)
        back = prom.now()
        resolved = wait_until(lambda: polled(stack, prom, ALERT) == "", 60, interval=2)
        report("path alert", f"resolved {prom.now() - back:.0f}s after the path came back")
        assert resolved, f"{ALERT} still active after the path came back"
        assert alert_state(prom, "NvmeofCsiAgentDown") == "" and alert_state(prom, "NvmeofCsiVolumeInaccessible") == ""

        time.sleep(8)  # I/O on both paths again, in the panels
        vm.write(FIO_STOP, "")  # fio stops its job, reports and exits 0 once this file exists (a signal: rc 128)
        out = fio.check()
        run = json.loads(out[out.index("{") :])["jobs"][0]
        assert run["error"] == 0, run
        end = prom.now()
        queries = [q for q in panel_queries("16s") if q.panel not in DATASET_PANELS]
        doc = prom.query(ranged=sorted({q.expr for q in queries}), start=start, end=end, step=4)
        empty = [f"{q.panel}: {q.expr}" for q in queries if not has_data(doc["range"][q.expr])]
        report("dashboard", f"{len(queries) - len(empty)} of {len(queries)} panel queries answered with data")
        assert not empty, "panels without data:\n" + "\n".join(empty)

        limit = doc["range"]['nvmeof_csi_volume_qos_limit{kind="read_iops",volume_id=~".*"}']
        assert [float(v) for _, v in limit[0]["values"]][-1] == 400
        enforced = doc["range"]['nvmeof_csi_volume_qos_enforced{volume_id=~".*"}']
        assert enforced and "pod_uid" not in enforced[0]["metric"] and enforced[0]["values"][-1][1] == "1"
        marks = {"path lost": lost, "alert firing": fired_at, "path back": back}
        for title in KEY_PANELS:
            chosen = [q for q in queries if q.panel == title]
            render(title, chosen, doc["range"], start, RESULTS / f"panel-{slug(title)}.png", marks)
        report("panels drawn", ", ".join(f"results/panel-{slug(t)}.png" for t in KEY_PANELS))
    finally:
        vm.run(["pkill", "-x", "fio"], timeout=30)  # a failed step leaves no fio behind for the next test
        try:
            prom.stop()
        finally:
            stack.csi({"op": "down", "name": "mon"})
        remove_pod(vm, pod)

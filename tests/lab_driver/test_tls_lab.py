"""NVMe/TCP TLS on the real kernels (the 6.12 lab kernel: nvmet and the host built with TLS; tlshd from
ktls-utils), end to end through CSI: a ``tls: psk`` StorageClass, the agent issuing this host a PSK at
ControllerPublishVolume and putting it in the kernel's ``.nvme`` keyring, the node fetching its own at
NodeStageVolume and connecting both paths with TLS 1.3.

On the wire (tcpdump on ``lo``, where target and host meet in this VM), a marker written through the TLS volume
never appears, while the same marker written through a clear-text volume does (so the capture can see). I/O goes
on through a dead path (``bench.pathloss`` measures that stall beside clear text). The TLS volume is on the TLS
portals only: a clear-text connect to a TLS portal and a connect to a clear portal are refused; a connect that
presents the host's identity with a PSK the agent never issued is refused, while the issued PSK connects (the
control). The write rates of both volumes are reported."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable

import pytest

from lab import Fabric, IoProbe, LabVM
from lab.stack import DRIVER_LOG, GuestDriver
from lab.target import LOG as AGENT_LOG
from lab.target import STATE_DIR, TWO_PORTALS, TWO_TLS_PORTALS
from tests.support.capture import captured, copies

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]
MiB = 1 << 20
WORK = "/run/nvmeof-csi/lab/volumes"  # lab.csi_ops.WORK: <name>/mount
T1, T2 = TWO_TLS_PORTALS
P1, P2 = TWO_PORTALS
#: ``LAB_TLS=none`` makes the TLS volume a clear-text one: the capture proof must then fail (it did)
TLS = os.environ.get("LAB_TLS", "psk")
VOLUMES = {"tl": ({"tls": TLS}, T1, T2), "cl": ({}, P1, P2)}


def raw_tls_connect(vm: LabVM, nqn: str, key_serial: int) -> int:
    """A TLS connect of this host (its /etc/nvme identity) to the first TLS portal presenting PSK ``key_serial``;
    the exit code. A controller it made is removed again."""
    host, host_id = (vm.check(["cat", f"/etc/nvme/{f}"]).strip() for f in ("hostnqn", "hostid"))
    opts = (
        f"transport=tcp,traddr={T1.traddr},trsvcid={T1.trsvcid},nqn={nqn},hostnqn={host},hostid={host_id},"
        f"tls,tls_key={key_serial}"
    )
    rc = vm.run(["sh", "-c", f"echo '{opts}' > /dev/nvme-fabrics"], 90).rc
    vm.run(["nvme", "disconnect", "-n", nqn], 60)
    return rc


def test_a_tls_volume_hides_its_bytes_fails_over_and_refuses_every_other_key(
    stack: GuestDriver, report: Reporter, kernel_release: str
) -> None:
    vm = stack.vm
    assert kernel_release.startswith("6.12"), kernel_release
    made = {}
    for name, (params, _a, _b) in VOLUMES.items():
        made[name] = stack.csi(
            {"op": "up", "name": name, "size": 128 * MiB, "mode": "mount", "fs": "ext4", "params": params},
            {"op": "probe-target", "name": name, "mib": 16},
        )
    nqn = made["tl"][0]["nqn"]
    ports = {name: [int(p.rsplit(":", 1)[1]) for p in made[name][0]["portals"].split(",")] for name in VOLUMES}
    gone: set[str] = set()  # volumes the test took down itself
    try:
        Fabric(vm).wait_paths(nqn, live=2)
        marker = f"nvmeof-csi-wire-marker-{secrets.token_hex(8)}"
        seen = {}
        for name in VOLUMES:
            with captured(vm, tuple(ports[name])) as pcap:
                target = f"{WORK}/{name}/mount/marker"
                vm.check(["sh", "-c", f"yes {marker} | head -c {4 * MiB} > {target} && sync {target}"], timeout=120)
            seen[name] = copies(vm, pcap, marker)
        report("tls capture on lo: (bytes captured, lines with the marker) tls, clear", f"{seen['tl']}, {seen['cl']}")
        assert seen["cl"][1] > 0, "the capture must see a clear-text volume's data (else it proves nothing)"
        assert seen["tl"][0] > max(MiB, seen["cl"][0] // 2), "the TLS volume's writes must be in the capture"
        assert seen["tl"][1] == 0, "a TLS volume's data crossed the fabric in clear text"
        for name, (_params, a, b) in VOLUMES.items():
            assert ports[name] == [a.trsvcid, b.trsvcid], (name, made[name][0]["portals"])
        host = vm.check(["cat", "/etc/nvme/hostnqn"]).strip()
        assert f"NVMe0R01 {host} {nqn}" in vm.check(["cat", "/proc/keys"])  # the issued PSK, in .nvme
        stats = dict(line.split() for line in vm.check(["cat", "/proc/net/tls_stat"]).splitlines())
        assert int(stats["TlsCurrTxSw"]) >= 4, stats  # both paths' queues, host and target ends, are kTLS sockets

        rates = {}
        for name in VOLUMES:
            out = vm.run(["dd", "if=/dev/zero", f"of={WORK}/{name}/mount/rate", "bs=1M", "count=32", "oflag=direct"])
            match = re.search(r"([\d.]+) ([kMG]?B)/s", out.err)
            assert out.rc == 0 and match, out.err
            rates[name] = float(match.group(1)) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3, "B": 1e-6}[match.group(2)]
        probe = IoProbe(vm, made["tl"][1]["path"], seconds=18)  # write+verify through a dead path
        time.sleep(3)
        Fabric(vm).blackhole(T1.trsvcid, True)  # segments to the first TLS portal vanish
        try:
            result = probe.result()
        finally:
            Fabric(vm).blackhole(T1.trsvcid, False)
        assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
        Fabric(vm).wait_paths(nqn, live=2, timeout=90)
        report(
            "tls: 32 MiB O_DIRECT write (tls, clear), failover stall (first TLS path black-holed; bench.pathloss "
            "measures it beside clear text)",
            f"{rates['tl']:.1f} MB/s, {rates['cl']:.1f} MB/s; {result.max_gap_s:.2f} s, 0 errors",
        )

        stack.csi({"op": "unpublish", "name": "tl"}, {"op": "unstage", "name": "tl"})  # attached: still allowed
        plain = ["nvme", "connect", "-t", "tcp", "-n", nqn]
        assert vm.run([*plain, "-a", T1.traddr, "-s", str(T1.trsvcid)], 60).rc != 0, "clear text on a TLS portal"
        assert vm.run([*plain, "-a", P1.traddr, "-s", str(P1.trsvcid)], 60).rc != 0, "a TLS volume on a clear portal"
        vm.run(["nvme", "disconnect", "-n", nqn], 60)
        keys = vm.check(["cat", "/proc/keys"]).splitlines()
        issued = next(int(k.split()[0], 16) for k in keys if f" psk       NVMe0R01 {host} {nqn}:" in k)
        assert raw_tls_connect(vm, nqn, issued) == 0, "the issued PSK must connect (else the refusal proves nothing)"
        imposter = int(
            vm.check(["sh", "-c", f"head -c 32 /dev/urandom | keyctl padd psk 'NVMe0R01 {host} {nqn}' @u"]).strip()
        )
        try:
            vm.check(["keyctl", "setperm", str(imposter), "0x3f3f0000"])  # tlshd may read it
            assert raw_tls_connect(vm, nqn, imposter) != 0, "the target took a PSK it never issued"
        finally:
            vm.run(["keyctl", "unlink", str(imposter), "@u"], 10)
        stack.csi({"op": "stage", "name": "tl"}, {"op": "publish", "name": "tl"})
        assert vm.check(["head", "-c", str(len(marker)), f"{WORK}/tl/mount/marker"]) == marker

        psks = set(vm.check(["sh", "-c", f"grep -rhoa 'NVMeTLSkey-1:01:[A-Za-z0-9+/=]*:' {STATE_DIR}"]).split())
        assert len(psks) == 1, "one PSK for this host"
        logs = vm.check(["cat", DRIVER_LOG, AGENT_LOG], timeout=30)
        assert not any(psk in logs or psk[16:-1] in logs for psk in psks), "a PSK reached a log"
        stack.csi({"op": "down", "name": "tl"})  # detached (DenyHost) and deleted: the kernel keyring lets it go
        gone.add("tl")
        assert f"NVMe0R01 {host} {nqn}" not in vm.check(["cat", "/proc/keys"]), "a PSK outlived its grant"
    finally:
        for name in VOLUMES:
            if name not in gone:
                stack.csi({"op": "down", "name": name})


def test_tls_and_dh_hmac_chap_together(stack: GuestDriver) -> None:
    """``tls: psk`` with ``auth: dhchap``: each path authenticates the host with its DH-HMAC-CHAP key inside the
    TLS session (the controller holds both), and written data reads back."""
    vm = stack.vm
    made = stack.csi(
        {
            "op": "up",
            "name": "ta",
            "size": 64 * MiB,
            "mode": "mount",
            "fs": "ext4",
            "params": {"tls": "psk", "auth": "dhchap"},
        },
        {"op": "probe-target", "name": "ta", "mib": 4},
    )
    nqn = made[0]["nqn"]
    try:
        Fabric(vm).wait_paths(nqn, live=2)
        ctrls = [c for c in vm.listdir("/sys/class/nvme") if vm.read(f"/sys/class/nvme/{c}/subsysnqn").strip() == nqn]
        assert len(ctrls) == 2, ctrls
        for ctrl in ctrls:
            assert vm.read(f"/sys/class/nvme/{ctrl}/dhchap_secret").startswith("DHHC-1:"), ctrl
            assert vm.read(f"/sys/class/nvme/{ctrl}/tls_key").strip() not in ("", "0"), ctrl  # a TLS session's PSK
            assert vm.read(f"/sys/class/nvme/{ctrl}/address").split(",")[1] in (
                f"trsvcid={T1.trsvcid}",
                f"trsvcid={T2.trsvcid}",
            )
        data = f"{WORK}/ta/mount/both"
        vm.check(["sh", "-c", f"head -c {2 * MiB} /dev/urandom > /tmp/both && cp /tmp/both {data} && sync {data}"])
        vm.check(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"])
        assert vm.check(["sha256sum", data]).split()[0] == vm.check(["sha256sum", "/tmp/both"]).split()[0]
    finally:
        stack.csi({"op": "down", "name": "ta"})

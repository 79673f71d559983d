"""A lab VM as a Kubernetes node (:mod:`lab.kube.layout` names them): containerd (with the CNI bridge) and
kubelet, joined to the host's control plane through QEMU user networking that only forwards the API server.

Guest network: the NIC with MAC ``KUBE_MAC`` is renamed ``kube``: QEMU ``-netdev user,restrict=on``, where the VM is
10.0.2.15 and 10.0.2.100:6443 is a ``guestfwd`` to the API server's loopback port on the host; nothing else leaves
the VM that way. The node's own address is its ``mgmt`` link's (the lab cluster's links). There is no
kube-proxy: the ``kubernetes`` Service's address (10.0.2.1, the first of the lab's service range) is put on the
node's loopback and relayed to the API server by socat, which is all in-cluster clients need.

Contract: :meth:`KubeNode.start` returns once this node's Node object is Ready (raises :class:`KubeError` with the
kubelet/containerd log tails); every image the tier needs is imported into containerd's ``k8s.io`` namespace
first (no registry is ever contacted: kubelet's pulls are ``IfNotPresent`` on present images).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from lab.fabric import RDMA_MODULES
from lab.kube.build import binary
from lab.kube.control_plane import GUEST_API, GUEST_API_PORT, SERVICE_IP, ControlPlane, KubeError
from lab.kube.layout import KUBE_MAC, KubeMachine, routes
from lab.target import GuestProcess
from lab.vm import LabVM

KUBE_IP = "10.0.2.15"  # the VM on its user network (the same in every VM: each has a user network of its own)
LOGS = "/scratch/kube"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
KUBELET_SOCK = "/var/lib/kubelet/pod-resources/kubelet.sock"
MODULES = ("overlay", "veth", "bridge", "virtio_net", "loop", "nvmet", "nvmet-tcp", "nvme-tcp")
"""kubelet: CNI bridge; loop for block volumes; the node set-up of docs/install.md (RDMA ones on RDMA nodes)"""


def qemu_netdev(api_port: int, forwards: Mapping[str, int] | None = None) -> list[str]:
    """QEMU arguments: a user-mode NIC that reaches nothing but the API server's host loopback port and, for each
    ``GUEST_IP:PORT`` of ``forwards``, that host loopback port (the storage node's way to the host's Alluxio);
    a ``guestfwd`` to a command runs one socat per guest connection (a ``tcp:`` target would be one)."""
    fwds = {f"{GUEST_API}:{GUEST_API_PORT}": api_port, **(forwards or {})}
    rules = ",".join(f"guestfwd=tcp:{at}-cmd:socat - TCP:127.0.0.1:{port}" for at, port in fwds.items())
    return [
        "-netdev",
        f"user,id=kube,restrict=on,net=10.0.2.0/24,host=10.0.2.2,{rules}",
        "-device",
        f"virtio-net-pci,netdev=kube,mac={KUBE_MAC}",
    ]


def containerd_config(cni_bin: str, pause_ref: str) -> str:
    """containerd's config. ``stats_collect_period``: the CRI runtime collects every container's stats (a Task
    Stats call to its shim, a dozen cgroup files read) for its CPU rate, by default every second; nothing here
    reads that rate (kubelet's summary comes from cAdvisor), and under TCG the shims of an idle node's pods took
    15-30 % of a vCPU for it: storage-1's QEMU used 66 % of a host core idle, 52 % with it every 30 s."""
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "{CONTAINERD_SOCK}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_ref}"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  stats_collect_period = "30s"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "/usr/sbin/runc"
      SystemdCgroup = false
"""


def cni_config(pod_cidr: str) -> str:
    """The node's CNI bridge on ``pod_cidr``, without masquerade (other nodes route pod ranges)."""
    bridge = {
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]},
    }
    return json.dumps({"cniVersion": "1.0.0", "name": "lab", "plugins": [bridge]}, indent=1)


def kubelet_config(ca: str) -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{CONTAINERD_SOCK}
failSwapOn: false
evictionHard: {{memory.available: "64Mi", nodefs.available: "1%", imagefs.available: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: ""
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
volumeStatsAggPeriod: 10s
"""


class KubeNode:
    def __init__(
        self,
        vm: LabVM,
        cp: ControlPlane,
        machine: KubeMachine,
        images: Mapping[str, Path],
        aliases: Mapping[str, str] | None = None,
        always: Collection[str] = (),
        slim: Mapping[str, tuple[str, Path]] | None = None,
    ) -> None:
        """``images``: reference -> OCI tar (its one tag is the reference's); ``aliases``: extra reference ->
        imported reference (the driver image is built with its package version and deployed as ``:lab``);
        ``always``: references imported at the node's first start even when containerd holds them (the driver's
        image keeps its tag, the package version, while its content changes with the code); a later start (a
        power cycle keeps the disk) finds them as this run imported them; ``slim``: reference -> (the reference it
        builds on, a tar of its own blobs only), imported from that tar when containerd holds what it builds on
        (the driver's image on its base: containerd hashes every blob of a tar it imports)."""
        self.vm, self.cp, self.machine, self.images = vm, cp, machine, images
        self.name = machine.name
        self.aliases, self.always = dict(aliases or {}), frozenset(always)
        self.slim = dict(slim or {})
        self.containerd = GuestProcess(vm, "containerd", [], CONTAINERD_SOCK, f"{LOGS}/containerd.log")
        self.kubelet = GuestProcess(vm, "kubelet", [], KUBELET_SOCK, f"{LOGS}/kubelet.log")
        self.phases: dict[str, float] = {}
        #: called once the images are in containerd, with the references imported in this run (none when the
        #: VM started from a saved disk that holds them all), before kubelet starts anything
        self.on_imported: Callable[[list[str]], None] | None = None

    def _sh(self, cmd: str, timeout: float = 120) -> str:
        res = self.vm.sh(cmd, timeout)
        if res.rc:
            raise KubeError(f"guest: {cmd}: rc={res.rc}\n{res.out[-1500:]}{res.err[-1500:]}")
        return res.out

    def prepare(self) -> None:
        """Kernel modules, the network, mounts (shared propagation; containerd and the pool on the scratch
        disk), cgroup controllers, and the config files."""
        m = self.machine
        for module in (*MODULES, *(RDMA_MODULES if m.rdma else ())):
            self.vm.check(["modprobe", module])
        nic = self._sh(f"grep -l '^{KUBE_MAC}$' /sys/class/net/*/address").strip().split("/")[-2]
        if nic != "kube":
            self._sh(f"ip link set dev {nic} name kube")
        pod_routes = "".join(f" && ip route replace {cidr} via {via} dev mgmt" for cidr, via in routes(m))
        self._sh(
            f"ip addr replace {m.node_ip}/24 dev mgmt && "
            f"ip link set lo up && ip link set kube up && ip addr replace {KUBE_IP}/24 dev kube && "
            f"ip route replace default via 10.0.2.2 dev kube && ip addr replace {SERVICE_IP}/32 dev lo && "
            f"sysctl -qw net.ipv4.ip_forward=1{pod_routes}"
        )
        if m.rdma:  # soft-RoCE on both fabric links: what makes this node publish transport-rdma=true
            shown = self._sh("rdma link show")
            for link in ("fa", "fb"):
                if f"rxe_{link}" not in shown:
                    self._sh(f"rdma link add rxe_{link} type rxe netdev {link}")
        self._sh(
            f"rm -rf {LOGS} && mkdir -p {LOGS} /scratch/containerd /var/lib/containerd /var/lib/kubelet "
            "/srv/nvmeof-pool /scratch/nvmeof-pool /etc/cni/net.d /etc/containerd /etc/kubernetes "
            "/etc/nvmeof-csi && "
            "mount --bind /scratch/containerd /var/lib/containerd && "
            "mount --bind /scratch/nvmeof-pool /srv/nvmeof-pool && "
            "mount -t tmpfs kubelet /var/lib/kubelet && mount --make-rshared /"
        )
        self._sh(
            "for c in $(cat /sys/fs/cgroup/cgroup.controllers); do "
            "echo +$c > /sys/fs/cgroup/cgroup.subtree_control || true; done"
        )
        cni_bin = str(binary("bridge").parent)
        pause = next(ref for ref in self.images if ref.startswith("localhost/pause:"))
        self.vm.write("/etc/containerd/config.toml", containerd_config(cni_bin, pause))
        self.vm.write("/etc/cni/net.d/10-lab.conflist", cni_config(m.pod_cidr))
        self.vm.write(
            "/etc/crictl.yaml",
            f"runtime-endpoint: unix://{CONTAINERD_SOCK}\nimage-endpoint: unix://{CONTAINERD_SOCK}\ntimeout: 60\n",
        )
        self.vm.write("/etc/kubernetes/kubelet.yaml", kubelet_config(str(self.cp.pki.ca.crt)))
        self.vm.write("/etc/nvme/hostnqn", m.host_nqn + "\n")
        self.vm.write("/etc/nvme/hostid", m.host_id + "\n")
        if m.storage:
            self.vm.write("/etc/nvmeof-csi/agent.env", m.agent_env())

    def start(self, timeout: float = 600) -> float:
        """Bring the node up; returns the seconds from containerd's start to Node Ready (each step's seconds in
        :attr:`phases`)."""
        self.prepare()
        t0 = lap = time.monotonic()

        def step(what: str) -> None:
            nonlocal lap
            now = time.monotonic()
            self.phases[what] = round(now - lap, 1)
            lap = now

        # the kubernetes Service address, relayed to the API server (stands in for kube-proxy's one rule)
        self.relay = self.vm.submit(
            ["socat", f"TCP-LISTEN:443,bind={SERVICE_IP},fork,reuseaddr", f"TCP:{GUEST_API}:{GUEST_API_PORT}"],
            timeout=6 * 3600,
        )
        self._start_containerd()
        step("containerd")
        imported = self.import_images()
        step("images imported" if imported else "images found on the saved disk")
        if self.on_imported is not None:
            self.on_imported(imported)
        m = self.machine
        self.kubelet.argv = [
            str(binary("kubelet")),
            "--config=/etc/kubernetes/kubelet.yaml",
            f"--kubeconfig={self.cp.kubelet_configs[self.name]}",
            f"--hostname-override={self.name}",
            f"--node-ip={m.node_ip}",
            "--v=2",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in m.labels.items()),
        ]
        self.kubelet.start(timeout=300)
        step("kubelet serving")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.vm.ensure_alive(f"waiting for Node {self.name} to be Ready")
            node = json.loads(self.cp.kubectl("get", "node", self.name, "-o", "json", check=False) or "{}")
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                step("Node Ready")
                return time.monotonic() - t0
            time.sleep(2)
        raise KubeError(f"node not Ready in {timeout:.0f}s\n{self.logs()}")

    def _start_containerd(self) -> None:
        ctrd = binary("containerd").parent
        self.containerd.argv = [
            "env",
            f"PATH={ctrd}:/usr/sbin:/usr/bin:/sbin:/bin",
            str(ctrd / "containerd"),
            "--config",
            "/etc/containerd/config.toml",
        ]
        self.containerd.start(timeout=180)

    def seed(self) -> list[str]:
        """Prepare the VM, start containerd and import the images, and start nothing else (no kubelet, no Node):
        a scratch disk for :mod:`lab.kube.scratch_cache` to save; returns the references imported."""
        self.prepare()
        self._start_containerd()
        return self.import_images()

    @staticmethod
    def ctr_argv(*args: str) -> list[str]:
        """``ctr`` on the node's containerd, in the namespace kubelet uses."""
        return [str(binary("ctr")), "--address", CONTAINERD_SOCK, "-n", "k8s.io", *args]

    def ctr(self, *args: str, timeout: float = 600) -> str:
        return self.vm.check(self.ctr_argv(*args), timeout=timeout)

    def import_images(self) -> list[str]:
        """Every image containerd does not hold yet (and those of ``always``), all at once (containerd takes
        concurrent imports; unpacking under TCG is CPU-bound and the guest has two vCPUs), then one listing
        proves each reference is there; returns the references imported."""
        held = set(self.ctr("images", "ls", "-q").split())
        todo = {ref: tar for ref, tar in self.images.items() if ref not in held or ref in self.always}
        tars = {
            ref: self.slim[ref][1] if ref in self.slim and self.slim[ref][0] in held else tar
            for ref, tar in todo.items()
        }
        pending = [
            self.vm.submit(
                self.ctr_argv("images", "import", "--base-name", ref.rsplit(":", 1)[0], str(tar)), timeout=900
            )
            for ref, tar in tars.items()
        ]
        for job in pending:
            job.check()
        listed = set(self.ctr("images", "ls", "-q").split())
        missing = sorted(set(self.images) - listed)
        if missing:
            raise KubeError(f"not in containerd after importing: {', '.join(missing)}")
        for alias, ref in self.aliases.items():
            self.ctr("images", "tag", "--force", ref, alias)
        self.always = frozenset()  # containerd holds this run's images now, on a disk a power cycle keeps
        return sorted(todo)

    def logs(self, lines: int = 60) -> str:
        """kubelet's and containerd's log tails, or, when the VM has exited, its console's."""
        if not self.vm.alive():
            return self.vm.exit_report("reading the node's logs")
        out = []
        for name in ("kubelet", "containerd"):
            out.append(f"--- {name}\n" + self.vm.run(["tail", "-n", str(lines), f"{LOGS}/{name}.log"], 10).out)
        return "\n".join(out)

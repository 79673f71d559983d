"""Build the lab's boot images: Debian's stock kernel (unpacked, never installed) and a busybox initramfs
holding only the modules the lab needs.

Two kernels (``LAB_KERNEL``, default ``6.12``): ``6.12`` is bookworm-backports' kernel (nvmet and the host with
DH-HMAC-CHAP, ``CONFIG_NVME_TARGET_AUTH``/``CONFIG_NVME_HOST_AUTH``, and NVMe/TCP TLS); ``6.1`` is bookworm's
own kernel (no in-band authentication), kept because GPU clusters run older kernels too. The backports kernel
is resolved through a private apt configuration under the cache folder: the host's apt sources are not touched.

Contract: :func:`build` is idempotent. It installs missing Debian packages, resolves the kernel package that
``linux-image-amd64`` depends on today (in the flavour's suite), and rebuilds ``vmlinuz``/``initrd.img`` in
the flavour's cache folder only when an input changed (kernel package version, module list, init script,
busybox, this recipe). The result is described by ``build.json`` next to the images. The cache is machine-wide
(``LAB_CACHE``, default ``lab/`` in :func:`image.machine_cache.machine_cache`) so a fresh clone reuses it. Needs
root (apt-get, depmod on the unpacked tree).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from image.apt import apt_options
from image.machine_cache import lab_cache

LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parent
CACHE = lab_cache()
INIT_SCRIPT = LAB_DIR / "guest" / "init.sh"

#: Host packages: QEMU, and the userland the guest uses through the 9p root share.
# fmt: off
PACKAGES = (
    "qemu-system-x86", "qemu-utils", "nvme-cli", "rdma-core", "ibverbs-utils", "fio", "busybox-static", "cpio",
    "kmod", "iproute2", "xfsprogs", "e2fsprogs", "udev", "util-linux", "socat", "dmsetup",
    "tcpdump", "keyutils", "libnl-genl-3-200",  # NVMe/TCP TLS: the capture proof, keyctl, tlshd's libraries
)

#: Modules in the initramfs (with their dependencies). Everything the guest may load must be here.
MODULES = (
    "virtio_pci", "virtio_console", "virtio_blk", "9p", "9pnet_virtio", "overlay", "configfs",
    "nvme-core", "nvme-fabrics", "nvme-tcp", "nvme-rdma", "nvmet", "nvmet-tcp", "nvmet-rdma",
    "tls", "gcm", "ghash-generic", "aesni-intel",  # kernel TLS (AES-GCM): tlshd hands it the NVMe/TCP session
    "rdma_rxe", "rdma_ucm", "ib_uverbs", "ib_umad", "dummy",
    "crc32c_generic", "crc32_generic", "crc32-pclmul", "crc32c-intel",
    "xfs", "ext4", "loop", "null_blk",
    "dm-mod", "dm-flakey",  # the agent's read-only subsystems: a device that refuses writes (agent/readonly.py)
    "drbd",  # replicated volumes: the kernel's DRBD 8.4 between two storage nodes (agent/drbd.py)
    "sch_prio", "sch_netem", "cls_u32", "act_gact",
    "inet_diag", "tcp_diag",  # socket diagnostics: ss shows the ToS of the NVMe/TCP queues' sockets
    "virtio_net", "veth", "bridge",  # the Kubernetes tier: the API server's forward, the pods' CNI bridge
)
BUSYBOX_APPLETS = (
    "sh", "mount", "umount", "mkdir", "modprobe", "insmod", "switch_root", "cat", "cut", "cp", "echo",
    "sleep", "ls", "ln", "rm", "poweroff",
)
# fmt: on


#: Lab kernel flavours: name -> the Debian suite its ``linux-image-amd64`` comes from ("" = the host's sources).
KERNELS = {"6.12": "bookworm-backports", "6.1": ""}
DEFAULT_KERNEL = "6.12"


class BuildError(RuntimeError):
    """A build step failed; the message names the step."""


def selected_kernel() -> str:
    """The flavour named by ``LAB_KERNEL`` (default :data:`DEFAULT_KERNEL`); ``BuildError`` for an unknown one."""
    name = os.environ.get("LAB_KERNEL", "") or DEFAULT_KERNEL
    if name not in KERNELS:
        raise BuildError(f"LAB_KERNEL={name!r} is not a lab kernel ({', '.join(KERNELS)})")
    return name


def kernel_cache(kernel: str | None = None, cache: Path = CACHE) -> Path:
    """The folder holding one flavour's images and ``build.json``."""
    return cache / f"kernel-{kernel or selected_kernel()}"


@dataclass(frozen=True)
class BuildInfo:
    """What a finished build produced (``build.json``)."""

    kernel_package: str
    kernel_package_version: str
    kernel_release: str
    inputs_sha256: str
    vmlinuz: str
    initrd: str
    built_at: str
    seconds: float

    @classmethod
    def load(cls, kernel: str | None = None, cache: Path = CACHE) -> BuildInfo:
        folder = kernel_cache(kernel, cache)
        try:
            return cls(**json.loads((folder / "build.json").read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise BuildError(
                f"the lab is not built ({folder}/build.json): run 'LAB_KERNEL={kernel or selected_kernel()} "
                "python -m lab build'"
            ) from exc


def _run(argv: Sequence[str], timeout: float = 900, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{' '.join(argv)}: {exc}") from exc
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def _say(msg: str) -> None:
    print(f"lab build: {msg}", flush=True)


def ensure_packages(packages: Sequence[str] = PACKAGES) -> None:
    missing = [p for p in packages if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode]
    if not missing:
        return
    _say(f"apt-get install {' '.join(missing)}")
    env_argv = ["env", "DEBIAN_FRONTEND=noninteractive"]
    _run([*env_argv, "apt-get", "update", "-qq"])
    _run([*env_argv, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing])


def resolve_kernel(apt: Sequence[str] = ()) -> tuple[str, str]:
    """(package, version) of the kernel image ``linux-image-amd64`` depends on, e.g. linux-image-6.1.0-57-amd64."""
    for attempt in range(2):
        try:
            lines = _run(["apt-cache", *apt, "depends", "linux-image-amd64"]).splitlines()
        except BuildError:
            if attempt:
                raise
            lines = []  # no package lists yet
        for line in lines:
            dep = line.strip().removeprefix("Depends:").strip()
            if line.strip().startswith("Depends:") and dep.startswith("linux-image-"):
                return dep, _candidate_version(dep, apt)
        if attempt == 0:
            _run(["apt-get", *apt, "update", "-qq"])  # package lists missing or stale
    raise BuildError("apt-cache knows no kernel behind linux-image-amd64 (is the Debian archive reachable?)")


def _candidate_version(package: str, apt: Sequence[str] = ()) -> str:
    for line in _run(["apt-cache", *apt, "policy", package]).splitlines():
        if line.strip().startswith("Candidate:"):
            return line.split(":", 1)[1].strip()
    raise BuildError(f"apt-cache policy {package}: no candidate version")


def inputs_digest(kernel: tuple[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([kernel, MODULES, BUSYBOX_APPLETS]).encode())
    digest.update(INIT_SCRIPT.read_bytes())
    digest.update(Path(__file__).read_bytes())  # the recipe itself
    digest.update(Path("/bin/busybox").read_bytes())
    return digest.hexdigest()


def _unpack_kernel(package: str, version: str, cache: Path, apt: Sequence[str] = ()) -> tuple[Path, str]:
    """Download and unpack the kernel .deb; return (unpacked root, kernel release)."""
    release = package.removeprefix("linux-image-")
    root = cache / "kpkg" / version
    if not (root / "boot" / f"vmlinuz-{release}").exists():
        dl = cache / "dl"
        dl.mkdir(parents=True, exist_ok=True)
        for stale in dl.glob("*.deb"):
            stale.unlink()
        _say(f"downloading {package} {version}")
        _run(["apt-get", *apt, "download", f"{package}={version}"], cwd=dl)
        debs = list(dl.glob(f"{package}_*.deb"))
        if not debs:
            raise BuildError(f"apt-get download left no {package} .deb in {dl}")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        _run(["dpkg-deb", "-x", str(debs[0]), str(root)])
        debs[0].unlink()
    _run(["depmod", "-b", str(root), release])
    return root, release


def _module_files(root: Path, release: str) -> list[Path]:
    files: set[Path] = set()
    for name in MODULES:
        out = _run(["modprobe", "-d", str(root), "-S", release, "--show-depends", name])
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == "insmod":
                files.add(Path(parts[1]))
    if not files:
        raise BuildError("no module files resolved")
    return sorted(files)


def _initramfs(root: Path, release: str, out: Path) -> int:
    """Write a gzip'd newc cpio with busybox, the module closure and /init; return the module count."""
    modules = _module_files(root, release)
    moddir = root / "lib" / "modules" / release
    with tempfile.TemporaryDirectory(prefix="lab-initrd-") as tmp:
        stage = Path(tmp)
        for d in ("bin", "dev", "proc", "sys", "mnt", "newroot"):
            (stage / d).mkdir()
        shutil.copy2("/bin/busybox", stage / "bin" / "busybox")
        for applet in BUSYBOX_APPLETS:
            (stage / "bin" / applet).symlink_to("busybox")
        (stage / "sbin").symlink_to("bin")
        target_moddir = stage / "lib" / "modules" / release
        for mod in modules:
            rel = mod.relative_to(moddir)
            (target_moddir / rel.parent).mkdir(parents=True, exist_ok=True)
            if rel.suffix == ".xz":  # 6.12 ships xz modules; busybox's modprobe in /init loads plain ELF only
                (target_moddir / rel.with_suffix("")).write_bytes(lzma.decompress(mod.read_bytes()))
            else:
                shutil.copy2(mod, target_moddir / rel)
        for meta in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            shutil.copy2(moddir / meta, target_moddir / meta)
        _run(["depmod", "-b", str(stage), release])
        shutil.copy2(INIT_SCRIPT, stage / "init")
        (stage / "init").chmod(0o755)
        names = _run(["find", "."], cwd=stage)
        proc = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet"], input=names.encode(), capture_output=True, cwd=stage, check=False
        )
        if proc.returncode != 0:
            raise BuildError(f"cpio failed: {proc.stderr.decode(errors='replace')}")
        tmp_out = out.with_suffix(".tmp")
        with gzip.open(tmp_out, "wb", compresslevel=1) as handle:
            handle.write(proc.stdout)
        os.replace(tmp_out, out)
    return len(modules)


def build(kernel: str | None = None, cache: Path = CACHE, force: bool = False) -> BuildInfo:
    """Build (or reuse) the images of one lab kernel flavour; see the module docstring."""
    start = time.monotonic()
    kernel = kernel or selected_kernel()
    if kernel not in KERNELS:
        raise BuildError(f"{kernel!r} is not a lab kernel ({', '.join(KERNELS)})")
    ensure_packages()
    apt = apt_options(KERNELS[kernel], cache)
    package, version = resolve_kernel(apt)
    digest = inputs_digest((package, version))
    folder = kernel_cache(kernel, cache)
    folder.mkdir(parents=True, exist_ok=True)
    if not force:
        try:
            info = BuildInfo.load(kernel, cache)
            if info.inputs_sha256 == digest and Path(info.vmlinuz).exists() and Path(info.initrd).exists():
                _say(f"up to date ({info.kernel_release}, {package} {version})")
                return info
        except BuildError:
            pass
    root, release = _unpack_kernel(package, version, folder, apt)
    vmlinuz = folder / "vmlinuz"
    shutil.copy2(root / "boot" / f"vmlinuz-{release}", vmlinuz)
    count = _initramfs(root, release, folder / "initrd.img")
    for old in (folder / "kpkg").iterdir():
        if old != root:
            shutil.rmtree(old, ignore_errors=True)
    info = BuildInfo(
        kernel_package=package,
        kernel_package_version=version,
        kernel_release=release,
        inputs_sha256=digest,
        vmlinuz=str(vmlinuz),
        initrd=str(folder / "initrd.img"),
        built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        seconds=round(time.monotonic() - start, 1),
    )
    (folder / "build.json").write_text(json.dumps(asdict(info), indent=1) + "\n")
    size = (folder / "initrd.img").stat().st_size >> 20
    _say(f"built {release}: vmlinuz + initrd.img ({count} modules, {size} MiB) in {info.seconds} s")
    return info

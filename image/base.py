"""The image's base layer: everything but our own package, which changes with every commit while this does not.

A debootstrapped bookworm root with ``image/packages.txt``, a venv at ``/opt/nvmeof-csi`` holding the driver's
dependencies (``[project].dependencies`` of ``pyproject.toml``), ``image/unused.txt`` applied. Packed as a
one-layer OCI image (tag = its key) whose layer is the first layer of every driver image built on it, so a node
that holds it (the Kubernetes tier's saved node disk does) unpacks only the small layer of our package when
the driver changes.

Contract: :func:`base` is idempotent and cached in ``$NVMEOF_CSI_CACHE/image/base-<key>/`` (``oci`` layout and
``base.oci.tar``); ``key`` hashes the package list, the unused list, the dependency list and :data:`RECIPE`, so
only a change of one of those rebuilds it. Built in a temporary folder and renamed into place: a crash leaves
no half base that a later build would trust. Needs root (debootstrap, chroot).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

from image.machine_cache import machine_cache
from image.tlshd import CONF_TEXT as TLSHD_CONF
from image.tlshd import ensure_tlshd
from image.tlshd import version as tlshd_version

REPO = Path(__file__).resolve().parent.parent
CACHE = machine_cache() / "image"
PACKAGES = REPO / "image" / "packages.txt"
UNUSED = REPO / "image" / "unused.txt"
CONSTRAINTS = REPO / "image" / "constraints.txt"
MIRROR = "http://deb.debian.org/debian"
PREFIX = "/opt/nvmeof-csi"
PYTHON = "3.11"  # bookworm's python3, which the base's venv runs
#: bump when how the base is made changes (its inputs' files are hashed as well)
RECIPE = (
    "base 3: debootstrap minbase, venv with the dependencies, unused.txt applied, pip removed, tlshd,"
    " bytecode as unchecked-hash"
)
#: pip settings of the build host that the install inside the root honours too
PIP_PASSED = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT")
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


class ImageError(RuntimeError):
    """A build step failed; the message names it."""


def say(msg: str) -> None:
    print(f"image: {msg}", flush=True)


def run(argv: Sequence[str], timeout: float = 1800, **kwargs: object) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageError(f"{' '.join(argv)}: {exc}") from exc
    if proc.returncode:
        raise ImageError(f"{' '.join(argv)} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
    return str(proc.stdout)


def packages() -> list[str]:
    return [ln.strip() for ln in PACKAGES.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def dependencies() -> list[str]:
    """The driver's run-time requirements, as ``pyproject.toml`` lists them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [str(d) for d in project["dependencies"]]


def unused(kind: str) -> list[str]:
    """The ``kind`` ("package", "pip" or "path") entries of ``image/unused.txt``."""
    found = []
    for line in UNUSED.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        what, _, entry = line.strip().partition(" ")
        if what not in ("package", "pip", "path") or not entry or " " in entry:
            raise ImageError(f"image/unused.txt: {line!r} is not 'package NAME', 'pip NAME' or 'path PATH'")
        if what == kind:
            found.append(entry)
    return found


def key() -> str:
    digest = hashlib.sha256(f"{RECIPE}\n{dependencies()}\n{tlshd_version()}\n".encode())
    digest.update(PACKAGES.read_bytes())
    digest.update(UNUSED.read_bytes())
    digest.update(CONSTRAINTS.read_bytes())
    return digest.hexdigest()[:16]


def debootstrapped(work: Path) -> Path:
    """The debootstrapped root for the package list, from the cache (a tar) or made now."""
    tar_key = hashlib.sha256(PACKAGES.read_bytes()).hexdigest()[:16]
    tarball = CACHE / f"rootfs-bookworm-{tar_key}.tar"
    root = work / "rootfs"
    if not tarball.exists():
        say(f"debootstrap bookworm with {len(packages())} packages (cached as {tarball.name})")
        staging = work / "debootstrap"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(packages())}", "bookworm", str(staging), MIRROR])
        for junk in (
            "var/cache/apt/archives",
            "var/lib/apt/lists",
            "usr/share/doc",
            "usr/share/man",
            "usr/share/locale",
            "usr/share/info",
        ):
            shutil.rmtree(staging / junk, ignore_errors=True)
        (staging / "var/lib/apt/lists").mkdir(parents=True, exist_ok=True)
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = tarball.with_suffix(".tmp")
        run(["tar", "-C", str(staging), "--numeric-owner", "-cf", str(tmp), "."])
        os.replace(tmp, tarball)
        shutil.rmtree(staging)
    root.mkdir()
    run(["tar", "-C", str(root), "--numeric-owner", "-xf", str(tarball)])
    return root


@contextlib.contextmanager
def proc_mounted(root: Path) -> Iterator[None]:
    run(["mount", "-t", "proc", "proc", str(root / "proc")])
    try:
        yield
    finally:
        run(["umount", "-l", str(root / "proc")])


def install_dependencies(root: Path) -> None:
    """A venv at :data:`PREFIX` with the driver's dependencies (not the driver: that is the top layer)."""
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    # the build host's trust store (it may sit behind a TLS-inspecting proxy); used for this install only
    host_ca = root / "tmp" / "build-host-ca.crt"
    shutil.copy2(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt", host_ca)
    env = {
        **CHROOT_ENV,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_CERT": "/tmp/build-host-ca.crt",
        **{k: v for k, v in os.environ.items() if k in PIP_PASSED},
    }
    shutil.copy2(CONSTRAINTS, root / "tmp" / "constraints.txt")
    try:
        with proc_mounted(root):
            run(["chroot", str(root), "python3", "-m", "venv", PREFIX], env=env)
            pip = [f"{PREFIX}/bin/pip", "install", "-q", "-c", "/tmp/constraints.txt"]
            run(["chroot", str(root), *pip, *dependencies()], env=env)
    finally:
        host_ca.unlink(missing_ok=True)
        (root / "tmp" / "constraints.txt").unlink(missing_ok=True)
        (root / "etc" / "resolv.conf").write_text("")
    unpinned(installed(root), pinned())


def pinned() -> dict[str, str]:
    """``image/constraints.txt``: normalized name -> version."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.strip().partition("==")
        if not sep or not name or not version:
            raise ImageError(f"image/constraints.txt: {line!r} is not NAME==VERSION")
        pins[normalized(name)] = version
    return pins


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(root: Path) -> dict[str, str]:
    """The distributions in the image's venv (pip and setuptools, the venv's seeds, aside)."""
    probe = "import importlib.metadata as m\nfor d in m.distributions(): print(d.metadata['Name'], d.version)"
    listed = run(["chroot", str(root), f"{PREFIX}/bin/python", "-c", probe], env=CHROOT_ENV)
    found = {normalized(name): version for name, version in (line.split() for line in listed.splitlines())}
    return {name: version for name, version in found.items() if name not in ("pip", "setuptools")}


def unpinned(found: dict[str, str], pins: dict[str, str]) -> None:
    """``ImageError`` naming every installed distribution that ``pins`` does not hold at its version."""
    wrong = sorted(f"{name}=={version}" for name, version in found.items() if pins.get(name) != version)
    if wrong:
        raise ImageError(f"installed but not pinned in image/constraints.txt: {', '.join(wrong)}")


def slim(root: Path) -> None:
    """Drop what the driver never runs (``image/unused.txt``), so every node unpacks less, and pip and
    setuptools from the venv (nothing installs at run time). A listed path must stay inside ``root``."""
    run(["chroot", str(root), "dpkg", "--purge", "--force-depends", *unused("package")], env=CHROOT_ENV)
    venv_python = f"{PREFIX}/bin/python"
    pip_unused = unused("pip")
    if pip_unused:
        run(["chroot", str(root), venv_python, "-m", "pip", "uninstall", "-q", "-y", *pip_unused], env=CHROOT_ENV)
    for rel in unused("path"):
        path = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ImageError(f"image/unused.txt: {rel!r} is not a path inside the image")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    run(["chroot", str(root), venv_python, "-m", "pip", "uninstall", "-q", "-y", "setuptools", "pip"], env=CHROOT_ENV)
    for tool in ("pip", "pip3", "pip3.11"):
        (root / PREFIX.lstrip("/") / "bin" / tool).unlink(missing_ok=True)


def compile_bytecode(root: Path, *folders: str) -> None:
    """Compile every module under ``folders`` (paths inside ``root``) as *unchecked-hash* bytecode: valid
    whatever the sources' times. A container's root is read-only, so a ``.pyc`` whose recorded source time
    differs from the file's (pip's ones in a packed layer: 501 of 2360 were off by a second) is compiled anew at
    every start, in memory; under emulation that was tens of seconds before a controller served."""
    python = f"{PREFIX}/bin/python"
    argv = ["chroot", str(root), python, "-m", "compileall", "-q", "-f", "-j", "0"]
    run([*argv, "--invalidation-mode", "unchecked-hash", *folders], env=CHROOT_ENV)


def stale_bytecode(site: Path) -> list[str]:
    """The modules under ``site`` (a site-packages folder on this host) that a read-only root would compile at
    every import: no ``.pyc``, or a timestamp one whose recorded source time or size is not the file's."""
    stale = []
    for source in sorted(site.rglob("*.py")):
        cached = source.parent / "__pycache__" / f"{source.stem}.cpython-{PYTHON.replace('.', '')}.pyc"
        try:
            header = cached.read_bytes()[:16]
        except FileNotFoundError:
            stale.append(str(source.relative_to(site)))
            continue
        flags, mtime, size = struct.unpack("<III", header[4:16])
        st = source.stat()
        if not flags & 1 and (mtime, size) != (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF):
            stale.append(str(source.relative_to(site)))
    return stale


def add_tlshd(root: Path) -> None:
    """``/usr/sbin/tlshd`` (Debian trixie's ktls-utils, the lab's cached copy: ``lab/tlshd.py``) and an
    ``/etc/tlshd.conf`` that links the kernel's ``.nvme`` keyring, for the chart's handshake daemon container."""
    shutil.copy2(ensure_tlshd(), root / "usr" / "sbin" / "tlshd")
    (root / "etc" / "tlshd.conf").write_text(TLSHD_CONF)


def pack(root: Path, out: Path, tag: str) -> None:
    """``root`` as a one-layer OCI image ``out/oci:tag`` (and ``out/base.oci.tar``)."""
    layout = out / "oci"
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:{tag}"])
    bundle = out / "bundle"
    run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)])
    shutil.rmtree(bundle / "rootfs")
    os.rename(root, bundle / "rootfs")
    run(["umoci", "repack", "--image", f"{layout}:{tag}", str(bundle)])
    run(["umoci", "gc", "--layout", str(layout)])
    shutil.rmtree(bundle)
    run(["tar", "-C", str(layout), "-cf", str(out / "base.oci.tar"), "."])


def base() -> Path:
    """The folder of the base for this checkout's inputs (``oci`` layout, tag = :func:`key`), built if missing."""
    out = CACHE / f"base-{key()}"
    if (out / "base.oci.tar").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    say(f"building the base layer {out.name}: {len(packages())} packages, {len(dependencies())} dependencies")
    with tempfile.TemporaryDirectory(prefix="nvmeof-image-", dir=CACHE) as tmp:
        work = Path(tmp)
        root = debootstrapped(work)
        install_dependencies(root)
        add_tlshd(root)
        slim(root)
        compile_bytecode(root, f"{PREFIX}/lib/python{PYTHON}/site-packages")
        staged = work / "out"
        staged.mkdir()
        pack(root, staged, key())
        shutil.rmtree(out, ignore_errors=True)
        os.rename(staged, out)
    return out

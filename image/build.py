"""Build the nvmeof-csi container image from Debian packages and PyPI alone (no image registry): debootstrap a
bookworm root with ``image/packages.txt``, install our wheel into ``/opt/nvmeof-csi``, and pack it as an OCI
image with umoci. The Dockerfile is the same image for users with a registry at hand (same package list).

Contract: :func:`build` is idempotent and cached in the machine-wide cache (``$NVMEOF_CSI_CACHE/image``): the
debootstrapped root is keyed by the package list, the image by the package list and every source file that
goes into the wheel, so a fresh clone on the same machine reuses both and only a changed input rebuilds. The
result is ``<cache>/image/<key>/oci`` (an OCI layout, tag = the package version) and ``nvmeof-csi.oci.tar`` (the
same layout as a tar, for ``ctr images import``), described by ``image.json``. Needs root (debootstrap,
chroot). Usage: ``python -m image.build [--force]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from lab.machine_cache import machine_cache

REPO = Path(__file__).resolve().parent.parent
CACHE = machine_cache() / "image"
PACKAGES = REPO / "image" / "packages.txt"
MIRROR = "http://deb.debian.org/debian"
PREFIX = "/opt/nvmeof-csi"
#: pip settings of the build host that the install inside the root honours too
PIP_PASSED = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT")
#: what goes into the wheel (and so into the image)
SOURCES = ("pyproject.toml", "setup.py", "nvmeof_csi", "proto")


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


def version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise ImageError("pyproject.toml has no version")


def source_digest() -> str:
    digest = hashlib.sha256(PACKAGES.read_bytes())
    digest.update(UNUSED.read_bytes())
    digest.update(Path(__file__).read_bytes())
    for name in SOURCES:
        root = REPO / name
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(REPO)
            if "gen" in rel.parts or "__pycache__" in rel.parts:
                continue
            digest.update(str(rel).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def base_root(work: Path) -> Path:
    """The debootstrapped root for the package list, from the cache (a tar) or made now."""
    key = hashlib.sha256(PACKAGES.read_bytes()).hexdigest()[:16]
    tarball = CACHE / f"rootfs-bookworm-{key}.tar"
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


def install_driver(root: Path, work: Path) -> None:
    """Our wheel (built here, stubs generated from the pinned protos) and its dependencies into a venv."""
    wheels = work / "wheel"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)])
    wheel = next(wheels.glob("nvmeof_csi-*.whl"))
    shutil.copy2(wheel, root / "tmp" / wheel.name)
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    # the build host's trust store (it may sit behind a TLS-inspecting proxy); used for this install only
    host_ca = root / "tmp" / "build-host-ca.crt"
    shutil.copy2(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt", host_ca)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_CERT": "/tmp/build-host-ca.crt",
        **{k: v for k, v in os.environ.items() if k in PIP_PASSED},
    }
    try:
        with proc_mounted(root):
            run(["chroot", str(root), "python3", "-m", "venv", PREFIX], env=env)
            run(["chroot", str(root), f"{PREFIX}/bin/pip", "install", "-q", f"/tmp/{wheel.name}"], env=env)
    finally:
        host_ca.unlink(missing_ok=True)
        (root / "tmp" / wheel.name).unlink(missing_ok=True)
        (root / "etc" / "resolv.conf").write_text("")
    for tool in ("nvmeof-csi", "nvmeofctl"):
        link = root / "usr" / "local" / "bin" / tool
        link.unlink(missing_ok=True)
        link.symlink_to(f"{PREFIX}/bin/{tool}")


UNUSED = REPO / "image" / "unused.txt"


def unused(kind: str) -> list[str]:
    """The ``kind`` ("package" or "path") entries of ``image/unused.txt``."""
    found = []
    for line in UNUSED.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        what, _, entry = line.strip().partition(" ")
        if what not in ("package", "path") or not entry or " " in entry:
            raise ImageError(f"image/unused.txt: {line!r} is not 'package NAME' or 'path PATH'")
        if what == kind:
            found.append(entry)
    return found


def slim(root: Path) -> None:
    """Drop what the driver never runs (``image/unused.txt``), so every node unpacks less, and pip and
    setuptools from the driver's venv (nothing installs at run time). A listed path must stay inside ``root``."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    run(["chroot", str(root), "dpkg", "--purge", "--force-depends", *unused("package")], env=env)
    for rel in unused("path"):
        path = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ImageError(f"image/unused.txt: {rel!r} is not a path inside the image")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    run(
        ["chroot", str(root), f"{PREFIX}/bin/python", "-m", "pip", "uninstall", "-q", "-y", "setuptools", "pip"],
        env=env,
    )
    for tool in ("pip", "pip3", "pip3.11"):
        (root / PREFIX.lstrip("/") / "bin" / tool).unlink(missing_ok=True)


def pack(root: Path, out: Path, tag: str) -> None:
    """``root`` as a one-layer OCI image ``out:tag`` with the driver as entrypoint."""
    layout = out / "oci"
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:{tag}"])
    bundle = out / "bundle"
    run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)])
    shutil.rmtree(bundle / "rootfs")
    os.rename(root, bundle / "rootfs")
    run(["umoci", "repack", "--image", f"{layout}:{tag}", str(bundle)])
    run(
        [
            "umoci",
            "config",
            "--image",
            f"{layout}:{tag}",
            "--config.entrypoint",
            "/usr/local/bin/nvmeof-csi",
            "--config.cmd",
            "--help",
            "--config.env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--config.workingdir",
            "/",
            "--author",
            "nvmeof-csi",
            "--history.comment",
            "nvmeof-csi image/build.py",
        ]
    )
    run(["umoci", "gc", "--layout", str(layout)])
    shutil.rmtree(bundle)
    run(["tar", "-C", str(layout), "-cf", str(out / "nvmeof-csi.oci.tar"), "."])


def build(force: bool = False) -> dict[str, object]:
    start = time.monotonic()
    key = source_digest()
    out = CACHE / key
    described = out / "image.json"
    if described.exists() and not force:
        info: dict[str, object] = json.loads(described.read_text())
        say(f"up to date ({info['layout']}:{info['tag']}, {info['size_mib']} MiB)")
        return info
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="nvmeof-image-", dir=CACHE) as tmp:
        work = Path(tmp)
        root = base_root(work)
        install_driver(root, work)
        slim(root)
        pack(root, out, version())
    size = sum(p.stat().st_size for p in (out / "oci" / "blobs").rglob("*") if p.is_file())
    info = {
        "layout": str(out / "oci"),
        "tag": version(),
        "tar": str(out / "nvmeof-csi.oci.tar"),
        "size_mib": round(size / 2**20, 1),
        "inputs": key,
        "seconds": round(time.monotonic() - start, 1),
    }
    described.write_text(json.dumps(info, indent=1) + "\n")
    for stale in CACHE.iterdir():  # keep the base roots and this image only
        if stale.is_dir() and stale != out and not stale.name.startswith("nvmeof-image-"):
            shutil.rmtree(stale, ignore_errors=True)
    say(f"built {info['layout']}:{info['tag']}: {info['size_mib']} MiB compressed in {info['seconds']} s")
    return info


def unpacked(info: dict[str, object]) -> Path:
    """The built image ``info`` unpacked once (``umoci unpack``: ``rootfs/`` and ``config.json``) into
    ``bundle/`` next to its layout in the machine-wide cache; later calls return it at once. A lab VM runs it
    from there over its read-only share of this host instead of unpacking it itself under TCG (minutes).
    Idempotent; unpacked into a temporary folder and renamed, so a crash never leaves half a bundle."""
    layout = Path(str(info["layout"]))
    out = layout.parent / "bundle"
    if (out / "config.json").exists():
        return out
    tmp = layout.parent / f"bundle.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    run(["umoci", "unpack", "--image", f"{layout}:{info['tag']}", str(tmp)], timeout=600)
    try:
        tmp.rename(out)
    except OSError:  # another run unpacked it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def current() -> dict[str, object]:
    """The description of the image built from this checkout (``ImageError`` when it is not built)."""
    described = CACHE / source_digest() / "image.json"
    if not described.exists():
        raise ImageError(f"the image of this checkout is not built ({described}): run ./dev image")
    info: dict[str, object] = json.loads(described.read_text())
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m image.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    args = parser.parse_args(argv)
    try:
        info = build(args.force)
    except ImageError as err:
        print(f"image: {err}", file=sys.stderr)
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build the nvmeof-csi container image from Debian packages and PyPI alone (no image registry): the base layer
of :mod:`image.base` (bookworm with ``image/packages.txt``, a venv with the driver's dependencies) and one layer
with our wheel, packed as an OCI image with umoci. The Dockerfile is the same image for users with a registry
at hand (same package list, same unused list).

Contract: :func:`build` is idempotent and cached in the machine-wide cache (``$NVMEOF_CSI_CACHE/image``): the
base is keyed by its own inputs, the image by the base's key and every source file that goes into the wheel,
so a fresh clone on the same machine reuses both and only a changed input rebuilds (a changed driver: its own
layer only, seconds). The result is ``<cache>/image/<key>/oci`` (an OCI layout, tag = the package version)
and ``nvmeof-csi.oci.tar`` (the same layout as a tar, for ``ctr images import``), described by ``image.json``,
which also names the base (``base_ref``, ``base_tar``) and ``slim_tar`` (``nvmeof-csi.slim.oci.tar``: the same
image without the base's blobs, importable where containerd holds the base): a node that holds the base
imports and unpacks only our layer.
Needs root (debootstrap, chroot). Usage: ``python -m image.build [--force]``.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

from image.base import CACHE, PREFIX, PYTHON, REPO, ImageError, compile_bytecode, run, say
from image.base import base as build_base
from image.base import key as base_key

#: what goes into the wheel (and so into the image)
SOURCES = ("pyproject.toml", "setup.py", "nvmeof_csi", "proto")
__all__ = ["ImageError", "build", "current", "unpacked"]

SCRIPT = """#!{prefix}/bin/python
import sys
from {module} import {attr}
if __name__ == "__main__":
    sys.exit({attr}())
"""


def source_digest() -> str:
    digest = hashlib.sha256(base_key().encode())
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


def version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def install_driver(root: Path, work: Path) -> None:
    """Our wheel (built here, stubs generated from the pinned protos) into the base's venv: its files unzipped
    into site-packages, compiled by the image's own Python, and its console scripts written (pip is not in the
    image; our wheel is pure Python and its dependencies are the base's)."""
    wheels = work / "wheel"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)])
    wheel = next(wheels.glob("nvmeof_csi-*.whl"))
    site = root / PREFIX.lstrip("/") / "lib" / f"python{PYTHON}" / "site-packages"
    if not site.is_dir():
        raise ImageError(f"the base has no {site.relative_to(root)}: is its Python {PYTHON}?")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)  # extractall keeps every member under ``site`` (absolute and .. parts dropped)
        scripts = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = zf.read(scripts).decode()
    compile_bytecode(root, f"/{site.relative_to(root)}/nvmeof_csi")
    points = configparser.ConfigParser()
    points.optionxform = str  # type: ignore[assignment,method-assign]
    points.read_string(entry_points)
    for name, target in points["console_scripts"].items():
        module, _, attr = target.strip().partition(":")
        script = root / PREFIX.lstrip("/") / "bin" / name
        script.write_text(SCRIPT.format(prefix=PREFIX, module=module, attr=attr))
        script.chmod(0o755)
        link = root / "usr" / "local" / "bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(f"{PREFIX}/bin/{name}")


def add_layer(base_dir: Path, out: Path, tag: str, work: Path) -> None:
    """The base image with one more layer (our package, from :func:`install_driver`) as ``out/oci:tag``, the
    driver as entrypoint, ``out/nvmeof-csi.oci.tar``, and ``out/nvmeof-csi.slim.oci.tar`` (without the base's
    blobs)."""
    layout = out / "oci"
    shutil.copytree(base_dir / "oci", layout, symlinks=True)
    run(["umoci", "tag", "--image", f"{layout}:{base_key()}", tag])
    run(["umoci", "rm", "--image", f"{layout}:{base_key()}"])
    bundle = work / "bundle"
    run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)])
    install_driver(bundle / "rootfs", work)
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
    # the same image without the base's blobs: a node that holds the base imports only what is ours (under TCG,
    # containerd hashes every blob of a tar it imports, the 80 MiB base layer too: 15 s against 1.4 s)
    slim = work / "slim"
    shutil.copytree(layout, slim, symlinks=True)
    shared = {blob.name for blob in (base_dir / "oci" / "blobs" / "sha256").iterdir()}
    for blob in (slim / "blobs" / "sha256").iterdir():
        if blob.name in shared:
            blob.unlink()
    run(["tar", "-C", str(slim), "-cf", str(out / "nvmeof-csi.slim.oci.tar"), "."])


def build(force: bool = False) -> dict[str, object]:
    start = time.monotonic()
    key = source_digest()
    out = CACHE / key
    described = out / "image.json"
    if described.exists() and not force:
        info: dict[str, object] = json.loads(described.read_text())
        say(f"up to date ({info['layout']}:{info['tag']}, {info['size_mib']} MiB)")
        return info
    base_dir = build_base()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="nvmeof-image-", dir=CACHE) as tmp:
        add_layer(base_dir, out, version(), Path(tmp))
    size = sum(p.stat().st_size for p in (out / "oci" / "blobs").rglob("*") if p.is_file())
    info = {
        "layout": str(out / "oci"),
        "tag": version(),
        "tar": str(out / "nvmeof-csi.oci.tar"),
        "size_mib": round(size / 2**20, 1),
        "base_ref": f"localhost/nvmeof-csi-base:{base_key()}",
        "base_tar": str(base_dir / "base.oci.tar"),
        "slim_tar": str(out / "nvmeof-csi.slim.oci.tar"),  # the image's own blobs only (the base's left out)
        "inputs": key,
        "seconds": round(time.monotonic() - start, 1),
    }
    described.write_text(json.dumps(info, indent=1) + "\n")
    for stale in CACHE.iterdir():  # keep the debootstrapped roots, this image and its base only
        if stale.is_dir() and stale not in (out, base_dir) and not stale.name.startswith("nvmeof-image-"):
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

"""The Kubernetes tier's small container images, built locally with umoci (no registry): the pod sandbox
(``localhost/pause``, our ``pause.c`` built static), the workload image (``localhost/workload``: busybox-static
with its applets) and one image per CSI sidecar binary from :mod:`lab.kube.build`.

Contract: :func:`build_images` is idempotent; the images are OCI layouts packed as tars under
``$NVMEOF_CSI_CACHE/kube/images-<key>/`` where ``key`` hashes every input (binaries, pause.c, this recipe), so
a fresh clone on the same machine reuses them. Each tar's single tag is the image's tag; import it with
``ctr images import --base-name <name>``. Returns ``{image reference: tar path}``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lab.kube.build import binary, cache_root, versions

HERE = Path(__file__).resolve().parent
PAUSE_TAG = "3.10"
BUSYBOX = Path("/bin/busybox")


@dataclass(frozen=True)
class Image:
    name: str  # e.g. localhost/csi-provisioner
    tag: str
    files: Mapping[str, Path]  # path in the image -> source file
    entrypoint: str
    busybox: bool = False  # add busybox's applets as /bin symlinks

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


def images(pause: Path, pins: Mapping[str, str] | None = None) -> list[Image]:
    pins = pins or versions()
    sidecars = [
        ("csi-provisioner", pins["CSI_PROVISIONER_VERSION"]),
        ("csi-attacher", pins["CSI_ATTACHER_VERSION"]),
        ("csi-resizer", pins["CSI_RESIZER_VERSION"]),
        ("csi-snapshotter", pins["EXTERNAL_SNAPSHOTTER_VERSION"]),
        ("snapshot-controller", pins["EXTERNAL_SNAPSHOTTER_VERSION"]),
    ]
    return [
        Image("localhost/pause", PAUSE_TAG, {"/pause": pause}, "/pause"),
        Image("localhost/workload", "lab", {"/bin/busybox": BUSYBOX}, "/bin/sh", busybox=True),
        *(Image(f"localhost/{name}", tag, {f"/{name}": binary(name, pins)}, f"/{name}") for name, tag in sidecars),
    ]


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr[-1500:]}")


def _pack(img: Image, out: Path, work: Path) -> None:
    layout, rootfs = work / "layout", work / "rootfs"
    shutil.rmtree(layout, ignore_errors=True)
    shutil.rmtree(rootfs, ignore_errors=True)
    for target, src in img.files.items():
        dst = rootfs / target.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        dst.chmod(0o755)
    if img.busybox:
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
        for applet in applets.split():
            link = rootfs / "bin" / applet
            if not link.exists():
                link.symlink_to("busybox")
    (rootfs / "tmp").mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", f"{layout}:{img.tag}"])
    _run(["umoci", "insert", "--rootless", "--image", f"{layout}:{img.tag}", str(rootfs), "/"])
    _run(
        [
            "umoci",
            "config",
            "--image",
            f"{layout}:{img.tag}",
            f"--config.entrypoint={img.entrypoint}",
            "--config.user=0:0",
        ]
    )
    _run(["umoci", "gc", "--layout", str(layout)])
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for entry in sorted(layout.iterdir()):
            tar.add(entry, arcname=entry.name)
    tmp.replace(out)


def _pause_binary(work: Path) -> Path:
    out = work / "pause"
    _run(["gcc", "-static", "-Os", "-s", "-o", str(out), str(HERE / "pause.c")])
    return out


def build_images() -> dict[str, Path]:
    """Build what is missing; ``{reference: OCI tar}`` for every image of the tier."""
    with tempfile.TemporaryDirectory(prefix="kube-images-") as tmp:
        work = Path(tmp)
        pause = _pause_binary(work)
        imgs = images(pause)
        digest = hashlib.sha256(Path(__file__).read_bytes())
        for img in imgs:
            digest.update(img.ref.encode())
            for target, src in sorted(img.files.items()):
                digest.update(target.encode())
                digest.update(
                    hashlib.sha256((HERE / "pause.c").read_bytes() if src == pause else src.read_bytes()).digest()
                )
        folder = cache_root() / f"images-{digest.hexdigest()[:16]}"
        folder.mkdir(parents=True, exist_ok=True)
        result: dict[str, Path] = {}
        for img in imgs:
            out = folder / f"{img.name.rsplit('/', 1)[1]}.tar"
            if not out.is_file():
                _pack(img, out, work)
            result[img.ref] = out
        return result


if __name__ == "__main__":
    for ref, path in build_images().items():
        print(ref, path)

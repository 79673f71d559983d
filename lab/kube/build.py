"""Build the Kubernetes tier's binaries from their Go modules (no release downloads): Kubernetes itself, etcd,
containerd, the CNI plugins, crictl and the CSI sidecars. Every version is pinned in ``versions.env``.

Contract: :func:`build` is idempotent. Each component lands in ``$NVMEOF_CSI_CACHE/kube/<name>-<version>/``
(machine-wide, outside the clone, so a fresh clone reuses it) with a ``.built`` stamp written last; a
component whose stamp exists is skipped, so an interrupted build resumes where it stopped. Go's build cache is
deleted after a build (it reaches ~12 GB). Nothing is installed system-wide. Usage:
``python -m lab.kube.build [--only NAME ...]``; prints each component's build time.

Module quirks handled here (facts, not taste):
- ``k8s.io/kubernetes``'s module zip has no ``staging/`` tree: each ``k8s.io/<name>`` it replaces with
  ``./staging/src/k8s.io/<name>`` is downloaded at the matching ``v0.<minor>.<patch>`` and placed there; a
  staging module the proxy does not serve (sample code, nothing we build imports) gets a bare ``go.mod``.
- etcd's ``server`` module replaces its sibling modules with ``../api`` etc.: all five are placed side by side.
- ``go install mod@v`` refuses a module with replace directives (the sidecars): the module is copied out of
  the module cache and built in place with ``go build``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from image.machine_cache import machine_cache

REPO = Path(__file__).resolve().parents[2]
VERSIONS = REPO / "versions.env"


class KubeBuildError(RuntimeError):
    """A build step failed; the message names the step and the tail of its output."""


def versions(path: Path = VERSIONS) -> dict[str, str]:
    """``NAME=value`` lines of ``versions.env`` (comments dropped); the environment overrides a pin."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Z0-9_]+)=(\S+)", line)
        if m:
            pins[m.group(1)] = os.environ.get(m.group(1), m.group(2))
    return pins


def cache_root() -> Path:
    return machine_cache() / "kube"


def _say(msg: str) -> None:
    print(f"kube-build: {msg}", flush=True)


@dataclass(frozen=True)
class Go:
    """The go command with the settings every build here uses (one shared, throw-away build cache)."""

    gocache: Path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "GOWORK": "off",
                "GOFLAGS": "-mod=mod -buildvcs=false",
                "GOTOOLCHAIN": "local",
                "CGO_ENABLED": "0",
                "GOCACHE": str(self.gocache),
            }
        )
        env.update(extra or {})
        return env

    def run(
        self,
        args: Sequence[str],
        cwd: Path | None = None,
        timeout: float = 3600,
        extra: Mapping[str, str] | None = None,
    ) -> str:
        argv = ["go", *args]
        try:
            proc = subprocess.run(
                argv, cwd=cwd, env=self.env(extra), capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KubeBuildError(f"{' '.join(argv)}: {exc}") from exc
        if proc.returncode:
            raise KubeBuildError(f"{' '.join(argv)} (in {cwd}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc.stdout

    def download(self, module: str, version: str) -> Path:
        """The read-only module-cache folder of ``module@version`` (downloaded if needed)."""
        out = self.run(["mod", "download", "-json", f"{module}@{version}"], cwd=Path(tempfile.gettempdir()))
        info = json.loads(out)
        if info.get("Error"):
            raise KubeBuildError(f"go mod download {module}@{version}: {info['Error']}")
        return Path(info["Dir"])


def copy_writable(src: Path, dst: Path) -> None:
    """Copy a module-cache tree (read-only files) to ``dst`` with owner write permission."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = Path(root, name)
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IWUSR)


@dataclass(frozen=True)
class Component:
    """One cached build: ``name``-``version`` and the function that fills its folder."""

    name: str
    version: str
    recipe: Callable[[Go, str, Path, Path], None]  # (go, version, work dir, output dir)

    def folder(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    def built(self) -> bool:
        return (self.folder() / ".built").is_file()


# -- recipes ---------------------------------------------------------------------------------------------
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")


def build_kubernetes(go: Go, version: str, work: Path, out: Path) -> None:
    src = work / "kubernetes"
    copy_writable(go.download("k8s.io/kubernetes", version), src)
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    for name in re.findall(r"k8s\.io/([\w-]+) => \./staging/src/k8s\.io/", (src / "go.mod").read_text()):
        dst = src / "staging/src/k8s.io" / name
        try:
            copy_writable(go.download(f"k8s.io/{name}", staging_version), dst)
        except KubeBuildError:  # not served (sample code): a bare module keeps the graph loadable
            dst.mkdir(parents=True, exist_ok=True)
            (dst / "go.mod").write_text(f"module k8s.io/{name}\n\ngo 1.24\n")
            _say(f"k8s.io/{name}@{staging_version} not served; a bare go.mod stands in (nothing built imports it)")
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    ldflags = " ".join(
        [
            "-s",
            "-w",
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
            f"-X {pkg}/base.gitVersion={version}",
            f"-X {pkg}/base.gitMajor={major}",
            f"-X {pkg}/base.gitMinor={minor}",
        ]
    )
    for binary in KUBE_BINARIES:
        t0 = time.monotonic()
        go.run(["build", "-trimpath", "-ldflags", ldflags, "-o", str(out / binary), f"./cmd/{binary}"], cwd=src)
        _say(f"  {binary} {time.monotonic() - t0:.0f}s")


def build_etcd(go: Go, version: str, work: Path, out: Path) -> None:
    root = work / "etcd"
    for module, place in (
        ("server/v3", "server"),
        ("api/v3", "api"),
        ("client/pkg/v3", "client/pkg"),
        ("client/v3", "client/v3"),
        ("pkg/v3", "pkg"),
    ):
        copy_writable(go.download(f"go.etcd.io/etcd/{module}", version), root / place)
    go.run(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "."], cwd=root / "server")


def build_containerd(go: Go, version: str, work: Path, out: Path) -> None:
    src = work / "containerd"
    copy_writable(go.download("github.com/containerd/containerd/v2", version), src)
    tags = "no_btrfs no_devmapper no_zfs no_aufs"
    for cmd in ("containerd", "containerd-shim-runc-v2", "ctr"):
        go.run(
            ["build", "-trimpath", "-tags", tags, "-ldflags", "-s -w", "-o", str(out / cmd), f"./cmd/{cmd}"], cwd=src
        )


def build_cni(go: Go, version: str, work: Path, out: Path) -> None:
    src = work / "cni"
    copy_writable(go.download("github.com/containernetworking/plugins", version), src)
    for plugin in ("main/bridge", "main/loopback", "ipam/host-local"):
        go.run(
            ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / plugin.split("/")[1]), f"./plugins/{plugin}"],
            cwd=src,
        )


def build_crictl(go: Go, version: str, work: Path, out: Path) -> None:
    src = work / "cri-tools"
    copy_writable(go.download("sigs.k8s.io/cri-tools", version), src)
    go.run(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "crictl"), "./cmd/crictl"], cwd=src)


def _sidecar(
    module: str, commands: Sequence[str], extra: Sequence[tuple[str, str]] = ()
) -> Callable[[Go, str, Path, Path], None]:
    def recipe(go: Go, version: str, work: Path, out: Path) -> None:
        src = work / "src"
        copy_writable(go.download(module, version), src)
        for mod, place in extra:
            copy_writable(go.download(mod, version), src / place)
        for cmd in commands:
            go.run(
                [
                    "build",
                    "-trimpath",
                    "-ldflags",
                    f"-s -w -X main.version={version}",
                    "-o",
                    str(out / cmd),
                    f"./cmd/{cmd}",
                ],
                cwd=src,
            )

    return recipe


def components(pins: Mapping[str, str]) -> list[Component]:
    """Every component of the tier, in build order (cheap ones first, so a failure shows early)."""
    return [
        Component("cni-plugins", pins["CNI_PLUGINS_VERSION"], build_cni),
        Component("crictl", pins["CRICTL_VERSION"], build_crictl),
        Component("containerd", pins["CONTAINERD_VERSION"], build_containerd),
        Component("etcd", pins["ETCD_VERSION"], build_etcd),
        Component(
            "csi-provisioner",
            pins["CSI_PROVISIONER_VERSION"],
            _sidecar("github.com/kubernetes-csi/external-provisioner/v6", ["csi-provisioner"]),
        ),
        Component(
            "csi-attacher",
            pins["CSI_ATTACHER_VERSION"],
            _sidecar("github.com/kubernetes-csi/external-attacher/v4", ["csi-attacher"]),
        ),
        Component(
            "csi-resizer",
            pins["CSI_RESIZER_VERSION"],
            _sidecar("github.com/kubernetes-csi/external-resizer/v2", ["csi-resizer"]),
        ),
        Component(
            "csi-snapshotter",
            pins["EXTERNAL_SNAPSHOTTER_VERSION"],
            _sidecar(
                "github.com/kubernetes-csi/external-snapshotter/v8",
                ["csi-snapshotter", "snapshot-controller"],
                [("github.com/kubernetes-csi/external-snapshotter/client/v8", "client")],
            ),
        ),
        Component("kubernetes", pins["KUBERNETES_BUILD_VERSION"], build_kubernetes),
    ]


def binary(name: str, pins: Mapping[str, str] | None = None) -> Path:
    """Where a built binary lives (e.g. ``binary("kubelet")``); ``KubeBuildError`` if it is not built."""
    for comp in components(pins or versions()):
        path = comp.folder() / name
        if comp.built() and path.is_file():
            return path
    raise KubeBuildError(f"{name} is not built: run ./dev setup (python -m lab.kube.build)")


def build(only: Sequence[str] = ()) -> dict[str, float]:
    """Build what is missing; the seconds each built component took (0 for a cached one)."""
    pins = versions()
    times: dict[str, float] = {}
    gocache = Path(tempfile.mkdtemp(prefix="kube-gocache-"))
    go = Go(gocache)
    try:
        for comp in components(pins):
            if only and comp.name not in only:
                continue
            if comp.built():
                times[comp.name] = 0.0
                continue
            _say(f"building {comp.name} {comp.version} into {comp.folder()}")
            t0 = time.monotonic()
            out = comp.folder()
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            with tempfile.TemporaryDirectory(prefix=f"kube-{comp.name}-") as work:
                comp.recipe(go, comp.version, Path(work), out)
            (out / ".built").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
            times[comp.name] = time.monotonic() - t0
            _say(f"{comp.name} built in {times[comp.name]:.0f}s")
    finally:
        shutil.rmtree(gocache, ignore_errors=True)  # Go's build cache reaches ~12 GB: never kept
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kube.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=(), help="component names (default: all)")
    args = parser.parse_args(argv)
    try:
        times = build(args.only)
    except KubeBuildError as exc:
        print(f"kube-build: FAILED: {exc}", file=sys.stderr)
        return 1
    _say("done: " + ", ".join(f"{k} {v:.0f}s" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

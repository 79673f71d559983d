"""Fetch, verify and compile the project's protobuf definitions into ``nvmeof_csi/gen``.

Contract:
- Upstream protos are never committed. Each ``proto/<name>.lock`` pins one (``csi.lock``: the CSI spec;
  ``pluginregistration.lock``: kubelet's plugin registration API): it is fetched from the named Go module with
  ``go mod download -json`` (the Go module proxy), its sha256 must equal the pinned one (a mismatch raises
  :class:`HashMismatch` and nothing is generated), and it is compiled as ``nvmeof_csi/gen/<name>_pb2``.
- Our own ``proto/*.proto`` files are compiled the same way.
- Output is Python modules (``*_pb2.py``, ``*_pb2_grpc.py``) plus ``.pyi`` stubs for both, written into the
  package folder ``nvmeof_csi/gen`` (git-ignored). Generation is idempotent: running it again rewrites the same files.

Standard library plus ``grpc_tools`` (a build requirement) only, because it runs at build time.
Usage: ``python proto/protogen.py`` from the repository root.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEN_PACKAGE = ("nvmeof_csi", "gen")


class ProtoGenError(RuntimeError):
    """Generation failed; the message says which step and why."""


class HashMismatch(ProtoGenError):
    """The downloaded spec file is not the one pinned in the lock file."""


@dataclass(frozen=True)
class SpecLock:
    """The pinned coordinates of the CSI spec (``proto/csi.lock``)."""

    module: str
    version: str
    file: str
    sha256: str

    @classmethod
    def read(cls, path: Path) -> SpecLock:
        values: dict[str, str] = {}
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ProtoGenError(f"{path}: line {raw!r} is not 'key = value'")
            values[key.strip()] = value.strip()
        try:
            return cls(values["module"], values["version"], values["file"], values["sha256"].lower())
        except KeyError as exc:
            raise ProtoGenError(f"{path}: missing key {exc.args[0]!r}") from exc


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(path: Path, expected: str) -> None:
    """Raise :class:`HashMismatch` unless ``path`` hashes to ``expected``."""
    actual = sha256_of(path)
    if actual != expected.lower():
        raise HashMismatch(
            f"{path.name}: sha256 {actual} does not match the pinned {expected}; "
            "refusing to generate stubs from an unverified spec (see proto/README.md)"
        )


def fetch_spec(lock: SpecLock, cache_dir: Path) -> Path:
    """Download the pinned module through the Go module proxy, verify the file, return a cached copy."""
    cached = cache_dir / f"{lock.module.replace('/', '_')}-{lock.version}-{Path(lock.file).name}"
    if cached.exists() and sha256_of(cached) == lock.sha256:
        return cached
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise ProtoGenError("the 'go' tool is needed to fetch the CSI spec (go mod download); install Go")
    argv = [go, "mod", "download", "-json", f"{lock.module}@{lock.version}"]
    env = dict(os.environ, GOFLAGS="-mod=mod", GO111MODULE="on")
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, env=env, cwd=tempfile.gettempdir(), check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ProtoGenError(f"{' '.join(argv)} timed out after 300 s") from exc
    info: dict[str, str] = {}
    with contextlib.suppress(ValueError):
        info = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or proc.stderr.strip() or proc.stdout.strip()
        raise ProtoGenError(f"{' '.join(argv)} failed (rc={proc.returncode}): {detail}")
    source = Path(info["Dir"]) / lock.file
    if not source.is_file():
        raise ProtoGenError(f"{lock.module}@{lock.version} has no {lock.file}")
    verify(source, lock.sha256)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, cached)
    return cached


def _plugin(name: str) -> str | None:
    """Locate a protoc plugin executable next to this interpreter or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def compile_protos(sources: dict[str, Path], out_root: Path) -> list[Path]:
    """Compile ``{module_name: proto_file}`` into ``out_root/nvmeof_csi/gen``; return the files written."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # build-time dependency

    mypy_grpc = _plugin("protoc-gen-mypy_grpc")
    gen_dir = out_root.joinpath(*GEN_PACKAGE)
    with tempfile.TemporaryDirectory(prefix="protogen-") as tmp:
        stage = Path(tmp).joinpath(*GEN_PACKAGE)
        stage.mkdir(parents=True)
        for module, src in sources.items():
            shutil.copyfile(src, stage / f"{module}.proto")
        include = str(Path(protoc.__file__).parent / "_proto")
        out = Path(tmp) / "out"
        out.mkdir()
        for module in sources:
            args = [
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{include}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
            ]
            if mypy_grpc:
                args += [f"--plugin=protoc-gen-mypy_grpc={mypy_grpc}", f"--mypy_grpc_out={out}"]
            args.append("/".join((*GEN_PACKAGE, f"{module}.proto")))
            if protoc.main(args) != 0:
                raise ProtoGenError(f"protoc failed for {module}.proto: {' '.join(args)}")
        gen_dir.mkdir(parents=True, exist_ok=True)
        written = []
        produced = out.joinpath(*GEN_PACKAGE)
        for path in sorted(produced.iterdir()):
            target = gen_dir / path.name
            shutil.copyfile(path, target)
            written.append(target)
        init = gen_dir / "__init__.py"
        init.write_text('"""Generated protobuf and gRPC modules (built at install time; never edit or commit)."""\n')
        (gen_dir / "py.typed").write_text("")
        written.append(init)
    return written


def generate(root: Path = ROOT) -> list[Path]:
    """Fetch and verify every pinned upstream proto, then compile them and our own. Returns the files written."""
    sources = {}
    for lock_file in sorted((root / "proto").glob("*.lock")):
        sources[lock_file.stem] = fetch_spec(SpecLock.read(lock_file), root / ".cache" / "proto")
    for own in sorted((root / "proto").glob("*.proto")):
        sources[own.stem] = own
    return compile_protos(sources, root)


if __name__ == "__main__":
    try:
        files = generate()
    except ProtoGenError as err:
        print(f"protogen: {err}", file=sys.stderr)
        raise SystemExit(1) from err
    print(f"protogen: wrote {len(files)} files into {'/'.join(GEN_PACKAGE)}")

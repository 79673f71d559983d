"""Dataset volumes without Alluxio: parameter validation, resumable hydration (fake cache, fake mkfs), the
release rule and the nvmeofctl summary. The real Alluxio runs in the alluxio tier."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from nvmeof_csi.datasets.client import CacheUnavailable, FileStatus, JobStatus
from nvmeof_csi.datasets.fill import DatasetVolumes, ufs_allowed
from nvmeof_csi.datasets.hydrate import DatasetMetrics, HydrationResult, Hydrator, Progress
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument, OutOfRange, PermissionDenied, SlotsBusy
from nvmeof_csi.host.executor import Result
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.nvmeof.dataset import DatasetSpec


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"dataset.path": "relative"}, "absolute"),
        ({"dataset.uri": "/d", "dataset.ttl": "soon"}, "dataset.ttl"),
        ({"dataset.uri": "/d", "dataset.ttl": "-1"}, "within 0.."),
        ({"dataset.uri": "/d", "dataset.medium": "tape"}, "dataset.medium"),
        ({"dataset.uri": "/d", "dataset.pin": "yes"}, "dataset.pin"),
        ({"dataset.uri": "/d", "dataset.colour": "x"}, "dataset.colour"),
        ({"dataset.pin": "true"}, "needs 'dataset.uri' or 'dataset.path'"),
    ],
)
def test_bad_dataset_parameters_are_named(params: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        DatasetSpec.from_parameters(params)


def test_dataset_spec_defaults() -> None:
    assert DatasetSpec.from_parameters({"transport": "tcp"}) is None
    spec = DatasetSpec.from_parameters({"dataset.uri": "s3://b/imagenet", "dataset.medium": "ssd"})
    assert spec is not None and spec.path.startswith("/datasets/") and spec.pin and spec.medium == "SSD"
    assert spec == DatasetSpec.from_parameters({"dataset.uri": "s3://b/imagenet", "dataset.medium": "SSD"})


class FakeCache:
    def __init__(self, files: dict[str, bytes], fail_after: int | None = None) -> None:
        self.files, self.fail_after, self.reads, self.attrs = files, fail_after, 0, []  # type: ignore[var-annotated]
        self.loaded: list[list[str]] = []
        self.freed = False
        self.lock = threading.Lock()

    def exists(self, path: str) -> bool:
        return True

    def files_(self) -> list[FileStatus]:
        return [FileStatus(f"/ds/{k}", False, len(v), False, -1, "", 0, (), "") for k, v in sorted(self.files.items())]

    def read(self, path: str) -> Iterator[bytes]:
        with self.lock:  # the hydrator reads several files at once
            if self.fail_after is not None and self.reads >= self.fail_after:
                raise CacheUnavailable("Alluxio at http://127.0.0.1:1 unreachable: ConnectionError")
            self.reads += 1
        yield self.files[path.removeprefix("/ds/")]

    def set_attribute(self, path: str, **kw: object) -> None:
        self.attrs.append((path, kw))

    def free(self, path: str) -> None:
        self.freed = True

    # loader
    def load(self, paths: list[str], replication: int = 1) -> int:
        self.loaded.append(paths)
        return len(self.loaded)

    def job_status(self, job_id: int) -> JobStatus:
        return JobStatus(job_id, "COMPLETED", "")

    def cancel(self, job_id: int) -> None: ...


class FakeMkfs:
    def __init__(self) -> None:
        self.trees: list[dict[str, bytes]] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result:
        tree = Path(argv[argv.index("-d") + 1])
        self.trees.append({str(p.relative_to(tree)): p.read_bytes() for p in tree.rglob("*") if p.is_file()})
        return Result(0, "", "")


def hydrator(cache: FakeCache, mkfs: FakeMkfs) -> Hydrator:
    rest = SimpleNamespace(
        exists=cache.exists,
        files=lambda _p: cache.files_(),
        read=cache.read,
        set_attribute=cache.set_attribute,
        free=cache.free,
    )
    return Hydrator(rest, cache, Filesystems(mkfs), DatasetMetrics(CollectorRegistry()), sleep=lambda _s: None)  # type: ignore[arg-type]


def test_hydration_resumes_from_its_journal_and_builds_the_filesystem_once(tmp_path: Path) -> None:
    files = {f"d{i % 3}/f{i}.bin": bytes([i]) * (1000 + i) for i in range(10)}
    spec = DatasetSpec("/ds", pin=True, ttl_seconds=60, medium="MEM")
    cache, mkfs = FakeCache(files, fail_after=4), FakeMkfs()
    seen: list[Progress] = []
    with pytest.raises(CacheUnavailable):
        hydrator(cache, mkfs).hydrate(spec, tmp_path / "vol.img", 1 << 30, tmp_path / "work", seen.append)
    first = cache.reads  # copies run side by side: every one that completed is journaled
    assert 4 <= first < 10 and mkfs.trees == []
    journal = (tmp_path / "work" / "journal.jsonl").read_text().splitlines()
    assert len(journal) == first and all(json.loads(line)["sha256"] for line in journal)

    cache.fail_after = None
    result = hydrator(cache, mkfs).hydrate(spec, tmp_path / "vol.img", 1 << 30, tmp_path / "work", seen.append)
    assert cache.reads == 10, "the journaled files must not be read again"
    assert mkfs.trees == [files] and result.files == 10 and result.bytes == sum(map(len, files.values()))
    assert result.ufs_bytes == result.bytes and result.hit_ratio == 0.0  # nothing was cached beforehand
    assert ("/ds", {"pinned": True, "pinned_media": ["MEM"]}) in cache.attrs
    assert ("/ds", {"ttl_ms": 60_000, "ttl_action": "FREE"}) in cache.attrs
    assert seen[-1].phase == "done" and not (tmp_path / "work" / "tree").exists()
    again = hydrator(cache, mkfs).hydrate(spec, tmp_path / "vol.img", 1 << 30, tmp_path / "work", seen.append)
    assert again == result and len(mkfs.trees) == 1, "a completed hydration is not repeated"


def test_a_data_set_larger_than_the_volume_is_out_of_range(tmp_path: Path) -> None:
    cache = FakeCache({"big.bin": b"x" * (1 << 20)})
    with pytest.raises(OutOfRange, match="the volume needs at least"):
        hydrator(cache, FakeMkfs()).hydrate(DatasetSpec("/ds"), tmp_path / "v", 1 << 20, tmp_path / "w", print)


def test_a_file_that_streams_more_than_its_listed_length_is_refused(tmp_path: Path) -> None:
    """Before, hydration wrote whatever the cache streamed: a file listed as 10 bytes could fill the agent's disk."""
    cache = FakeCache({"small.bin": b"x" * 10})
    listed = cache.files_
    cache.files["small.bin"] = b"x" * (1 << 20)  # listed at 10 bytes, streams 1 MiB
    cache.files_ = lambda: [replace(f, length=10) for f in listed()]  # type: ignore[method-assign]
    with pytest.raises(FailedPrecondition, match="more than its listed 10 bytes"):
        hydrator(cache, FakeMkfs()).hydrate(DatasetSpec("/ds"), tmp_path / "v", 1 << 30, tmp_path / "w", print)
    assert not list((tmp_path / "w").rglob("*.part"))


def test_release_only_after_the_last_volume(tmp_path: Path) -> None:
    cache = FakeCache({})
    volumes = DatasetVolumes(hydrator(cache, FakeMkfs()), tmp_path)
    spec = DatasetSpec("/ds")
    volumes.release(spec, [DatasetSpec("/other"), DatasetSpec("/ds")])
    assert not cache.freed
    volumes.release(spec, [DatasetSpec("/other")])
    assert cache.freed and ("/ds", {"pinned": False}) in cache.attrs


class FakeFolders:
    """Alluxio's namespace calls the holders use, over a set of folder paths."""

    def __init__(self) -> None:
        self.folders: set[str] = set()

    def create_directory(self, path: str) -> None:
        self.folders.add(path)

    def delete(self, path: str, recursive: bool = False) -> None:
        from nvmeof_csi.datasets.client import CacheNotFound

        if path not in self.folders:
            raise CacheNotFound(path)
        self.folders = {f for f in self.folders if f != path and not (recursive and f.startswith(path + "/"))}

    def list_status(self, path: str) -> list[SimpleNamespace]:
        from nvmeof_csi.datasets.client import CacheNotFound

        children = [f for f in self.folders if f.startswith(path + "/") and "/" not in f[len(path) + 1 :]]
        if not children and path not in self.folders:
            raise CacheNotFound(path)
        return [SimpleNamespace(path=f) for f in children]


def test_a_data_set_is_released_only_when_no_agent_holds_it(tmp_path: Path) -> None:
    from nvmeof_csi.datasets.holders import DatasetHolders

    cache, folders = FakeCache({}), FakeFolders()
    a = DatasetVolumes(hydrator(cache, FakeMkfs()), tmp_path, holders=DatasetHolders(folders, "store-a"))  # type: ignore[arg-type]
    b = DatasetVolumes(hydrator(cache, FakeMkfs()), tmp_path, holders=DatasetHolders(folders, "store-b"))  # type: ignore[arg-type]
    spec = DatasetSpec("/ds")
    for agent in (a, b):
        assert agent.holders is not None
        agent.holders.hold(spec)
    a.release(spec, [])  # store-a's last volume of /ds goes; store-b still has one
    assert not cache.freed
    b.release(spec, [])
    assert cache.freed and ("/ds", {"pinned": False}) in cache.attrs
    assert folders.folders == set()  # nothing left of the holders' records


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [
        ("/srv/datasets/imagenet", True),
        ("/srv/datasets", True),
        ("s3://bucket/train/x", True),
        ("/srv/datasets-evil/x", False),
        ("/srv/datasets/../../etc", False),
        ("/etc/shadow", False),
        ("s3://bucket/trainer", False),
        ("s3://other/train", False),
        ("/srv/datasets/%2e%2e/%2e%2e/etc", False),  # before: allowed, and the under-store decodes it to ../..
        ("/srv/datasets/%252e%252e/etc", False),
        ("s3://bucket/train%2F..%2Fsecrets", False),
        ("/srv/datasets/a%5C..%5C..%5Cetc", False),
        ("/srv/datasets/100%25%20done", True),
    ],
)
def test_under_store_allow_list_matches_whole_segments(uri: str, allowed: bool) -> None:
    assert ufs_allowed(uri, ["/srv/datasets/", "s3://bucket/train"]) is allowed


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"dataset.uri": "/etc", "dataset.path": "/datasets/etc"}, "not under an under-store"),
        ({"dataset.uri": "/srv/ok/a", "dataset.path": "/secrets/a"}, "data-set root"),
        ({"dataset.path": "/other/a"}, "data-set root"),
    ],
)
def test_the_agent_is_no_confused_deputy(tmp_path: Path, params: dict[str, str], needle: str) -> None:
    """Before, any dataset.uri was mounted into Alluxio and read by the agent: a StorageClass could make the
    storage node copy any folder it can read (its own /etc) into a volume."""
    volumes = DatasetVolumes(hydrator(FakeCache({}), FakeMkfs()), tmp_path, ["/srv/ok"], "/datasets")
    with pytest.raises(PermissionDenied, match=needle):
        spec = DatasetSpec.from_parameters(params)
        assert spec is not None
        volumes.fill("3f6c1f8e-0000-4000-8000-000000000001", spec, tmp_path / "v.img", 1 << 30)


def test_ttl_is_bounded() -> None:
    with pytest.raises(InvalidArgument, match=r"dataset\.ttl"):
        DatasetSpec.from_parameters({"dataset.path": "/d", "dataset.ttl": str(10**9)})


class GatedHydrator:
    """A hydrator whose every hydration waits for ``gate``; counts how many run at once."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.running = self.most = 0
        self.lock = threading.Lock()

    def hydrate(self, spec: DatasetSpec, backing: Path, capacity: int, work: Path, report: object) -> HydrationResult:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.gate.wait(10)
        with self.lock:
            self.running -= 1
        return HydrationResult(1, 1, 1, 0, ("w1",))


def test_at_most_max_fills_slots_are_held_and_only_a_background_caller_waits_for_one(tmp_path: Path) -> None:
    volumes = DatasetVolumes(GatedHydrator(), tmp_path, max_fills=2)  # type: ignore[arg-type]
    got = threading.Event()

    def resume() -> None:
        with volumes.slot(wait=True):  # a background resume waits for a slot
            got.set()

    with volumes.slot(wait=False), volumes.slot(wait=False):
        with pytest.raises(SlotsBusy, match="all 2 fill slots"), volumes.slot(wait=False):  # an RPC thread
            pass
        waiter = threading.Thread(target=resume)
        waiter.start()
        assert not got.wait(0.2)
    waiter.join(10)
    assert got.is_set()


def test_the_completion_marker_is_written_atomically_and_the_journal_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvmeof_csi.datasets import copier as copier_mod
    from nvmeof_csi.host.atomic import write_atomic

    written: list[Path] = []
    reads: list[Path] = []
    real_read = copier_mod.read_journal

    def spy_write(path: Path, data: bytes) -> None:
        written.append(path)
        write_atomic(path, data)

    def spy_read(path: Path) -> dict[str, dict[str, object]]:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr("nvmeof_csi.datasets.hydrate.write_atomic", spy_write)
    monkeypatch.setattr(copier_mod, "read_journal", spy_read)
    files = {"a.bin": b"a" * 100, "b/c.bin": b"c" * 200}
    spec = DatasetSpec("/ds", pin=False, ttl_seconds=0, medium="")
    hydrator(FakeCache(files), FakeMkfs()).hydrate(
        spec, tmp_path / "vol.img", 1 << 30, tmp_path / "work", lambda _p: None
    )
    assert written == [tmp_path / "work" / "complete.json"]  # temp file, fsync, rename, folder fsync
    assert reads == [tmp_path / "work" / "journal.jsonl"]
    assert json.loads((tmp_path / "work" / "complete.json").read_text())["files"] == 2

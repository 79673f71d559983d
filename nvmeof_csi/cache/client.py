"""A typed client for Alluxio 2.x: the REST proxy (``/api/v1/paths``, ``/api/v1/streams``) and the job
master (``/api/v1/master/job``), on ``requests``.

Contract:
- every call has a timeout; connection errors, timeouts and 5xx answers are retried (tenacity, bounded
  attempts with backoff) and then raised as :class:`CacheUnavailable` (gRPC UNAVAILABLE at the boundary);
- a 4xx answer is not retried: 404 / "does not exist" -> :class:`CacheNotFound`, anything else
  :class:`CacheRequestError` (FAILED_PRECONDITION) with Alluxio's own message;
- paths are Alluxio paths ("/datasets/a"); statuses are parsed into :class:`FileStatus` (length, pinned, TTL,
  percentage cached, block locations by worker host and tier).
The :class:`DatasetLoader` protocol is what hydration needs from a cache: 2.x implements it with job-master
load jobs (:class:`JobServiceLoader`); a 3.x ``/v1/load`` adapter can implement the same protocol later.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import requests
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from nvmeof_csi.errors import FailedPrecondition, NotFound, Unavailable

log = logging.getLogger(__name__)
CHUNK = 4 << 20
#: Jackson type ids of the 2.x job configs (JobConfig uses JsonTypeInfo.Id.CLASS)
LOAD = "alluxio.job.plan.load.LoadConfig"
BATCHED = "alluxio.job.plan.BatchedJobConfig"


class CacheUnavailable(Unavailable):
    """Alluxio cannot be reached, or answered with a server error, after retries."""


class CacheRequestError(FailedPrecondition):
    """Alluxio refused the request (4xx); the message is Alluxio's."""


class CacheNotFound(NotFound):
    pass


@dataclass(frozen=True)
class BlockLocation:
    host: str
    tier: str


@dataclass(frozen=True)
class FileStatus:
    path: str
    folder: bool
    length: int
    pinned: bool
    ttl_ms: int
    ttl_action: str
    in_alluxio_percentage: int
    locations: tuple[BlockLocation, ...]
    ufs_path: str
    block_hosts: tuple[tuple[str, ...], ...] = ()  # per block: the worker hosts holding a copy

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> FileStatus:
        """A proxy URIStatus (fields under ``fileInfo``) or a bare FileInfo."""
        doc = doc.get("fileInfo", doc)
        locations = []
        block_hosts = []
        for fbi in doc.get("fileBlockInfos") or []:
            hosts = []
            for loc in (fbi.get("blockInfo") or {}).get("locations") or []:
                host = (loc.get("workerAddress") or {}).get("host", "")
                locations.append(BlockLocation(host, loc.get("tierAlias", "")))
                hosts.append(host)
            block_hosts.append(tuple(hosts))
        ttl = doc.get("ttl", -1)
        return cls(
            path=doc.get("path", ""), folder=bool(doc.get("folder")), length=int(doc.get("length", 0)),
            pinned=bool(doc.get("pinned")), ttl_ms=int(ttl if ttl is not None else -1),
            ttl_action=str(doc.get("ttlAction", "")), in_alluxio_percentage=int(doc.get("inAlluxioPercentage", 0)),
            locations=tuple(locations), ufs_path=doc.get("ufsPath", ""), block_hosts=tuple(block_hosts),
        )


@dataclass(frozen=True)
class JobStatus:
    job_id: int
    status: str  # CREATED, RUNNING, COMPLETED, FAILED, CANCELED
    error: str

    @property
    def finished(self) -> bool:
        return self.status in ("COMPLETED", "FAILED", "CANCELED")


class DatasetLoader(Protocol):
    """Warm a cache with a set of files; poll; cancel."""

    def load(self, paths: list[str], replication: int = 1) -> int: ...

    def job_status(self, job_id: int) -> JobStatus: ...

    def cancel(self, job_id: int) -> None: ...


_transient = retry_if_exception_type(CacheUnavailable)


class AlluxioRest:
    """The REST proxy and the job master of one Alluxio 2.x cluster."""

    def __init__(self, proxy_url: str, job_url: str, timeout: float = 30.0, attempts: int = 4,
                 session: requests.Session | None = None) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.job_url = job_url.rstrip("/")
        self.timeout = timeout
        self._shared = session  # an injected session serves every thread (tests); else one per thread
        self._local = threading.local()
        self._retry = retry(retry=_transient, stop=stop_after_attempt(attempts), reraise=True,
                            wait=wait_exponential(multiplier=0.2, max=3))

    # -- transport ---------------------------------------------------------------------------------------
    @property
    def _session(self) -> requests.Session:
        """This thread's HTTP session (a ``requests.Session`` is not meant to be shared between threads)."""
        if self._shared is not None:
            return self._shared
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _call(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        base, _, rest = url.partition("/api/")

        def once() -> requests.Response:
            try:
                resp = self._session.request(method, url, timeout=self.timeout, **kwargs)
            except requests.RequestException as exc:
                raise CacheUnavailable(f"Alluxio at {base} unreachable: {type(exc).__name__}") from exc
            if resp.status_code >= 500:
                text = _message(resp)
                if "does not exist" in text or "FileDoesNotExist" in text or "NotFound" in text:
                    raise CacheNotFound(f"Alluxio: {text}")
                raise CacheUnavailable(f"Alluxio {method} {rest}: {resp.status_code} {text}")
            if resp.status_code == 404:
                raise CacheNotFound(f"Alluxio: {_message(resp)}")
            if resp.status_code >= 400:
                raise CacheRequestError(f"Alluxio refused {rest}: {_message(resp)}")
            return resp

        result: requests.Response = self._retry(once)()
        return result

    def _path_op(self, path: str, op: str, body: dict[str, Any] | None = None,
                 params: dict[str, str] | None = None) -> Any:
        url = f"{self.proxy_url}/api/v1/paths/{quote(_absolute(path))}/{op}"  # the proxy wants /paths//a/b/op
        resp = self._call("POST", url, json=body or {}, params=params)
        return resp.json() if resp.content else None

    # -- namespace -----------------------------------------------------------------------------------------
    def mount(self, path: str, ufs_uri: str, readonly: bool = True) -> None:
        self._path_op(path, "mount", {"readOnly": readonly}, params={"src": ufs_uri})

    def unmount(self, path: str) -> None:
        self._path_op(path, "unmount")

    def create_directory(self, path: str) -> None:
        self._path_op(path, "create-directory", {"recursive": True, "allowExists": True})

    def delete(self, path: str, recursive: bool = False) -> None:
        self._path_op(path, "delete", {"recursive": recursive})

    def exists(self, path: str) -> bool:
        return bool(self._path_op(path, "exists"))

    def get_status(self, path: str) -> FileStatus:
        return FileStatus.from_json(self._path_op(path, "get-status"))

    def list_status(self, path: str, recursive: bool = False) -> list[FileStatus]:
        docs = self._path_op(path, "list-status", {"recursive": recursive})
        return [FileStatus.from_json(d) for d in docs or []]

    def files(self, path: str) -> list[FileStatus]:
        """Every file under ``path`` (recursive), sorted by path."""
        return sorted((s for s in self.list_status(path, recursive=True) if not s.folder), key=lambda s: s.path)

    def set_attribute(self, path: str, *, pinned: bool | None = None, ttl_ms: int | None = None,
                      ttl_action: str = "FREE", recursive: bool = True,
                      pinned_media: list[str] | None = None) -> None:
        body: dict[str, Any] = {"recursive": recursive}
        if pinned is not None:
            body["pinned"] = pinned
        if pinned_media:
            body["pinnedMedia"] = pinned_media
        if ttl_ms is not None:
            body["commonOptions"] = {"ttl": ttl_ms, "ttlAction": ttl_action}
        self._path_op(path, "set-attribute", body)

    def free(self, path: str, recursive: bool = True, forced: bool = True) -> None:
        self._path_op(path, "free", {"recursive": recursive, "forced": forced})

    # -- data ------------------------------------------------------------------------------------------------
    def read(self, path: str) -> Iterator[bytes]:
        """Stream a file's bytes (open-file, then streams/ID/read; the stream is always closed)."""
        stream_id = int(self._path_op(path, "open-file", {"readType": "CACHE"}))
        try:
            url = f"{self.proxy_url}/api/v1/streams/{stream_id}/read"
            try:
                resp = self._session.post(url, timeout=self.timeout, stream=True)
            except requests.RequestException as exc:
                raise CacheUnavailable(f"Alluxio read of {path} failed: {type(exc).__name__}") from exc
            if resp.status_code != 200:
                raise CacheUnavailable(f"Alluxio read of {path}: {resp.status_code} {_message(resp)}")
            try:
                yield from resp.iter_content(CHUNK)
            except requests.RequestException as exc:
                raise CacheUnavailable(f"Alluxio read of {path} broke off: {type(exc).__name__}") from exc
        finally:
            try:
                self._session.post(f"{self.proxy_url}/api/v1/streams/{stream_id}/close", timeout=self.timeout)
            except requests.RequestException:
                log.debug("closing Alluxio stream %s failed (the proxy expires it)", stream_id)

    # -- metrics ---------------------------------------------------------------------------------------------
    def metrics(self, web_url: str) -> dict[str, float]:
        """A server's metrics (``WEB_URL/metrics/json/``, master or worker) as name -> value."""
        doc = self._call("GET", f"{web_url.rstrip('/')}/metrics/json/").json()
        values: dict[str, float] = {}
        for kind in ("counters", "gauges"):
            for name, item in (doc.get(kind) or {}).items():
                value = item.get("count", item.get("value"))
                if isinstance(value, int | float):
                    values[name] = float(value)
        return values


class JobServiceLoader:
    """:class:`DatasetLoader` on the Alluxio 2.x job service: one batched ``Load`` job per call."""

    def __init__(self, rest: AlluxioRest) -> None:
        self._rest = rest

    def load(self, paths: list[str], replication: int = 1) -> int:
        if len(paths) == 1:
            config: dict[str, Any] = {"@type": LOAD, "filePath": paths[0], "replication": replication}
        else:
            config = {"@type": BATCHED, "jobType": "Load",
                      "jobConfig": [{"@type": LOAD, "filePath": p, "replication": str(replication)} for p in paths]}
        resp = self._rest._call("POST", f"{self._rest.job_url}/api/v1/master/job/run", json=config)
        return int(resp.json())

    def job_status(self, job_id: int) -> JobStatus:
        doc = self._rest._call("GET", f"{self._rest.job_url}/api/v1/master/job/get_status",
                               params={"jobId": str(job_id)}).json()
        return JobStatus(job_id, str(doc.get("status", "")), str(doc.get("errorMessage", "") or ""))

    def cancel(self, job_id: int) -> None:
        self._rest._call("POST", f"{self._rest.job_url}/api/v1/master/job/cancel", params={"jobId": str(job_id)})


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise CacheRequestError(f"Alluxio path {path!r} must be absolute")
    return path


def _message(resp: requests.Response) -> str:
    try:
        doc = resp.json()
    except (ValueError, json.JSONDecodeError):
        return resp.text.strip()[:300]
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("statusCode") or doc)[:300]
    return str(doc)[:300]

"""A typed client for Alluxio 2.x: the REST proxy (``/api/v1/paths``, ``/api/v1/streams``) and the job
master (``/api/v1/master/job``), on ``urllib3`` (one thread-safe connection pool shared by every thread: a
request costs about half the client CPU of ``requests``, which matters for the thousands of round trips of a
hydration).

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import urllib3
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from nvmeof_csi.errors import FailedPrecondition, NotFound, Unavailable

log = logging.getLogger(__name__)
CHUNK = 4 << 20
POOL_SIZE = 16  # connections kept per server: at least the hydrator's concurrent copies
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
            path=doc.get("path", ""),
            folder=bool(doc.get("folder")),
            length=int(doc.get("length", 0)),
            pinned=bool(doc.get("pinned")),
            ttl_ms=int(ttl if ttl is not None else -1),
            ttl_action=str(doc.get("ttlAction", "")),
            in_alluxio_percentage=int(doc.get("inAlluxioPercentage", 0)),
            locations=tuple(locations),
            ufs_path=doc.get("ufsPath", ""),
            block_hosts=tuple(block_hosts),
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

    def __init__(
        self,
        proxy_url: str,
        job_url: str,
        timeout: float = 30.0,
        attempts: int = 4,
        http: urllib3.PoolManager | None = None,
    ) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.job_url = job_url.rstrip("/")
        self.timeout = timeout
        self._http = http or urllib3.PoolManager(
            maxsize=POOL_SIZE, retries=False, timeout=urllib3.Timeout(connect=timeout, read=timeout)
        )
        self._retry = retry(
            retry=_transient,
            stop=stop_after_attempt(attempts),
            reraise=True,
            wait=wait_exponential(multiplier=0.2, max=3),
        )

    # -- transport ---------------------------------------------------------------------------------------
    def _send(
        self, method: str, url: str, json_body: Any = None, params: dict[str, str] | None = None, stream: bool = False
    ) -> urllib3.BaseHTTPResponse:
        """One request, not retried; a transport failure raises :class:`CacheUnavailable`. ``stream`` leaves
        the body unread (the caller reads it and releases the connection)."""
        if params:
            url = f"{url}?{urlencode(params)}"
        body = None if json_body is None else json.dumps(json_body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            return self._http.request(method, url, body=body, headers=headers, preload_content=not stream)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            base = url.partition("/api/")[0]
            raise CacheUnavailable(f"Alluxio at {base} unreachable: {type(exc).__name__}") from exc

    def _call(
        self,
        method: str,
        url: str,
        json_body: Any = None,
        params: dict[str, str] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        rest = url.partition("/api/")[2]

        def once() -> urllib3.BaseHTTPResponse:
            resp = self._send(method, url, json_body, params)
            if resp.status >= 500:
                text = _message(resp)
                if "does not exist" in text or "FileDoesNotExist" in text or "NotFound" in text:
                    raise CacheNotFound(f"Alluxio: {text}")
                raise CacheUnavailable(f"Alluxio {method} {rest}: {resp.status} {text}")
            if resp.status == 404:
                raise CacheNotFound(f"Alluxio: {_message(resp)}")
            if resp.status >= 400:
                raise CacheRequestError(f"Alluxio refused {rest}: {_message(resp)}")
            return resp

        result: urllib3.BaseHTTPResponse = self._retry(once)()
        return result

    def _path_op(
        self, path: str, op: str, body: dict[str, Any] | None = None, params: dict[str, str] | None = None
    ) -> Any:
        url = f"{self.proxy_url}/api/v1/paths/{quote(_absolute(path))}/{op}"  # the proxy wants /paths//a/b/op
        resp = self._call("POST", url, json_body=body or {}, params=params)
        return _json(resp) if resp.data else None

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

    def set_attribute(
        self,
        path: str,
        *,
        pinned: bool | None = None,
        ttl_ms: int | None = None,
        ttl_action: str = "FREE",
        recursive: bool = True,
        pinned_media: list[str] | None = None,
    ) -> None:
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
            resp = self._send("POST", f"{self.proxy_url}/api/v1/streams/{stream_id}/read", stream=True)
            whole = False
            try:
                if resp.status != 200:
                    raise CacheUnavailable(f"Alluxio read of {path}: {resp.status} {_message(resp)}")
                yield from resp.stream(CHUNK)
                whole = True
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise CacheUnavailable(f"Alluxio read of {path} broke off: {type(exc).__name__}") from exc
            finally:
                if whole:
                    resp.release_conn()
                else:  # a half-read body must not go back to the pool
                    resp.close()
        finally:
            try:
                self._send("POST", f"{self.proxy_url}/api/v1/streams/{stream_id}/close")
            except CacheUnavailable:
                log.debug("closing Alluxio stream %s failed (the proxy expires it)", stream_id)

    # -- metrics ---------------------------------------------------------------------------------------------
    def metrics(self, web_url: str) -> dict[str, float]:
        """A server's metrics (``WEB_URL/metrics/json/``, master or worker) as name -> value."""
        doc = _json(self._call("GET", f"{web_url.rstrip('/')}/metrics/json/"))
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
            config = {
                "@type": BATCHED,
                "jobType": "Load",
                "jobConfig": [{"@type": LOAD, "filePath": p, "replication": str(replication)} for p in paths],
            }
        resp = self._rest._call("POST", f"{self._rest.job_url}/api/v1/master/job/run", json_body=config)
        return int(_json(resp))

    def job_status(self, job_id: int) -> JobStatus:
        doc = _json(
            self._rest._call("GET", f"{self._rest.job_url}/api/v1/master/job/get_status", params={"jobId": str(job_id)})
        )
        return JobStatus(job_id, str(doc.get("status", "")), str(doc.get("errorMessage", "") or ""))

    def cancel(self, job_id: int) -> None:
        self._rest._call("POST", f"{self._rest.job_url}/api/v1/master/job/cancel", params={"jobId": str(job_id)})


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise CacheRequestError(f"Alluxio path {path!r} must be absolute")
    return path


def _json(resp: urllib3.BaseHTTPResponse) -> Any:
    try:
        return json.loads(resp.data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CacheUnavailable(f"Alluxio answered {resp.status} with a body that is not JSON") from exc


def _message(resp: urllib3.BaseHTTPResponse) -> str:
    text = resp.data.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("statusCode") or doc)[:300]
    return str(doc)[:300]

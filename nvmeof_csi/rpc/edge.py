"""The RPC edge around every unary call of every service (CSI and the target agent): request ID, one log line
in (the request, secrets stripped) and one out (status code and duration; at DEBUG also the response), the
keyed try-locks the service's lock table names, and the single error boundary.

Two flavours share one per-call scope (:class:`_Scope`): :class:`EdgeInterceptor` for asyncio servers (the
CSI services) and :class:`ThreadedEdgeInterceptor` for the threaded server (the target agent, whose every call
is blocking work: its handler runs straight on a server thread, with no event-loop round trip per call). grpc
runs each threaded call in a fresh ``contextvars.Context``, so nothing of one call (request ID, caller) leaks
into the next call on the same thread (``tests/component/test_threaded_edge.py`` holds grpc to that).

Contract: a servicer raises domain errors; here they become the status code they carry. Unknown exceptions
become INTERNAL and their traceback is logged. Nothing below the servicers calls ``context.abort``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf.message import Message

from nvmeof_csi.rpc import logctx
from nvmeof_csi.rpc.boundary import is_expected, to_status
from nvmeof_csi.rpc.locks import KeyedLocks, LockTable
from nvmeof_csi.rpc.redact import safe_text

log = logging.getLogger("nvmeof_csi.rpc")

Context = grpc.aio.ServicerContext[Any, Any] | grpc.ServicerContext
Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
ThreadedHandler = Callable[[Any, grpc.ServicerContext], Any]
#: Called with the full method name and the call's context before the call runs; raises ``PermissionDenied``.
Authorize = Callable[[str, Context], None]
#: Called once per finished call with the full method name, its status code and its duration in seconds.
Observe = Callable[[str, grpc.StatusCode, float], None]


def _request_id(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key in ("x-request-id", "csi.requestid") and isinstance(value, str) and value:
            return value[:64]
    return uuid.uuid4().hex[:12]


async def _until_done(work: Awaitable[Any], release: Callable[[], None], short: str) -> Any:
    """Await ``work`` and then ``release`` its keys. When the caller goes away first (deadline passed,
    cancelled), the work is not abandoned half-way: it runs on to its end and only then releases the keys, so a
    retry meanwhile gets ABORTED instead of a second concurrent run."""
    task = asyncio.ensure_future(work)
    deferred = False
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            log.info("< %s CANCELLED by the caller; the work runs to its end and keeps its locks until then", short)
            task.add_done_callback(lambda done: _finished_late(done, release, short))
            deferred = True
        raise
    finally:
        if not deferred:
            release()


def _finished_late(task: asyncio.Future[Any], release: Callable[[], None], short: str) -> None:
    release()
    if not task.cancelled() and task.exception() is not None:
        log.info("%s finished after its caller left: %s", short, task.exception())
    else:
        log.info("%s finished after its caller left; its locks are released", short)


class _Scope:
    """One call at the edge: log context and the in line (:meth:`open`: then authorization and the lock keys;
    returns the release of the keys), the out line (:meth:`ok` / :meth:`failed`, the error boundary) and
    :meth:`close` (metrics, log context reset)."""

    def __init__(self, edge: _Edge, method: str, short: str, request: Message, context: Context) -> None:
        self._edge, self._method, self.short = edge, method, short
        self._rid = logctx.request_id.set(_request_id(context))
        self._vol = logctx.volume_id.set(str(getattr(request, "volume_id", "") or getattr(request, "name", "") or "-"))
        self._start = time.monotonic()
        self._verbose = log.isEnabledFor(logging.INFO)  # the redacted text of a message costs: only when logged
        self.code = grpc.StatusCode.OK
        if self._verbose:
            log.info("> %s %s", short, safe_text(request))

    def open(self, request: Message, context: Context) -> Callable[[], None]:
        if self._edge.authorize is not None:
            self._edge.authorize(self._method, context)  # before anything else runs (PERMISSION_DENIED)
        keys = [f"{f}={getattr(request, f)}" for f in self._edge.table.get(self._method, ()) if getattr(request, f, "")]
        return self._edge.locks.take(*keys)  # before the work exists: a busy key means it never starts

    def ok(self, response: Message) -> None:
        if self._verbose:  # the response's text (a ListVolumes page can be large) only at DEBUG
            detail = safe_text(response) if log.isEnabledFor(logging.DEBUG) else ""
            log.info("< %s OK %.3fs %s", self.short, time.monotonic() - self._start, detail)

    def failed(self, exc: Exception) -> tuple[grpc.StatusCode, str]:
        """The one error boundary: the status code and message ``exc`` becomes, logged."""
        self.code, message = to_status(exc)
        if is_expected(exc):
            log.info("< %s %s %.3fs %s", self.short, self.code.name, time.monotonic() - self._start, message)
        else:
            log.exception("< %s %s %.3fs unexpected error", self.short, self.code.name, time.monotonic() - self._start)
        return self.code, message

    def close(self) -> None:
        if self._edge.observe is not None:
            self._edge.observe(self._method, self.code, time.monotonic() - self._start)
        logctx.volume_id.reset(self._vol)
        logctx.request_id.reset(self._rid)


class _Edge:
    """What both flavours hold: the keyed try-locks, the lock table, the hooks, each method's wrapped handler."""

    def __init__(
        self,
        locks: KeyedLocks,
        lock_table: LockTable,
        authorize: Authorize | None = None,
        observe: Observe | None = None,
    ) -> None:
        self.locks = locks
        self.table = lock_table
        self.authorize = authorize
        self.observe = observe
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}  # by method; a handler never changes

    def wrapped(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any] | None, wrap: Callable[[str, str, Any], Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """``handler`` with its unary-unary behaviour wrapped by ``wrap(method, short name, behaviour)``."""
        known = self._wrapped.get(method)
        if known is not None or handler is None or handler.unary_unary is None:
            return known or cast(grpc.RpcMethodHandler[Any, Any], handler)
        wrapped = grpc.unary_unary_rpc_method_handler(
            wrap(method, method.rsplit("/", 1)[-1], handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped


class EdgeInterceptor(_Edge, grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """The edge of an asyncio server; see the module docstring."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method: str = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None:
            return known
        return self.wrapped(method, await continuation(handler_call_details), self._wrap)

    def _wrap(self, method: str, short: str, inner: Handler) -> Handler:
        async def call(request: Message, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            scope = _Scope(self, method, short, request, context)
            try:
                release = scope.open(request, context)
                response = await _until_done(inner(request, context), release, short)
                scope.ok(response)
                return response
            except Exception as exc:
                await context.abort(*scope.failed(exc))
                raise  # abort() raises; keeps type checkers sure this path never returns
            except asyncio.CancelledError:
                scope.code = grpc.StatusCode.CANCELLED
                raise
            finally:
                scope.close()

        return call


class ThreadedEdgeInterceptor(_Edge, grpc.ServerInterceptor):  # type: ignore[type-arg]
    """The edge of a threaded server; see the module docstring. A caller that goes away does not stop the
    work: the handler runs to its end on its thread and only then releases its keys."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method: str = handler_call_details.method
        known = self._wrapped.get(method)
        return known if known is not None else self.wrapped(method, continuation(handler_call_details), self._wrap)

    def _wrap(self, method: str, short: str, inner: ThreadedHandler) -> ThreadedHandler:
        def call(request: Message, context: grpc.ServicerContext) -> Any:
            scope = _Scope(self, method, short, request, context)
            try:
                release = scope.open(request, context)
                try:
                    response = inner(request, context)
                finally:
                    release()
                scope.ok(response)
                return response
            except Exception as exc:
                context.abort(*scope.failed(exc))  # raises
                raise
            finally:
                scope.close()

        return call

"""The RPC edge around every unary call of every service (CSI and the target agent): request ID, one log line
in (the request, secrets stripped) and one out (status code and duration; at DEBUG also the response), the
keyed try-locks the service's lock table names, and the single error boundary.

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

Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
#: Called with the full method name and the call's context before the call runs; raises ``PermissionDenied``.
Authorize = Callable[[str, grpc.aio.ServicerContext[Any, Any]], None]
#: Called once per finished call with the full method name, its status code and its duration in seconds.
Observe = Callable[[str, grpc.StatusCode, float], None]


def _request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
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


class EdgeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps every unary-unary handler; see the module docstring."""

    def __init__(
        self, locks: KeyedLocks, lock_table: LockTable, authorize: Authorize | None = None,
        observe: Observe | None = None,
    ) -> None:
        self._locks = locks
        self._table = lock_table
        self._authorize = authorize
        self._observe = observe
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}  # by method; filled on the event loop

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method: str = handler_call_details.method
        known = self._wrapped.get(method)  # a method's handler never changes: wrap it once
        if known is not None:
            return known
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._wrap(method, cast(Handler, handler.unary_unary)),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, method: str, inner: Handler) -> Handler:
        lock_fields = self._table.get(method, ())
        short = method.rsplit("/", 1)[-1]

        async def call(request: Message, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            rid = logctx.request_id.set(_request_id(context))
            vol = logctx.volume_id.set(str(getattr(request, "volume_id", "") or getattr(request, "name", "") or "-"))
            start = time.monotonic()
            verbose = log.isEnabledFor(logging.INFO)  # the redacted text of a message costs: only when logged
            if verbose:
                log.info("> %s %s", short, safe_text(request))
            code = grpc.StatusCode.OK
            try:
                if self._authorize is not None:
                    self._authorize(method, context)  # before anything else runs (PERMISSION_DENIED)
                keys = [f"{f}={getattr(request, f)}" for f in lock_fields if getattr(request, f, "")]
                release = self._locks.take(*keys)  # before the work exists: a busy key means it never starts
                response = await _until_done(inner(request, context), release, short)
                if verbose:  # the response's text (a ListVolumes page can be large) only at DEBUG
                    detail = safe_text(response) if log.isEnabledFor(logging.DEBUG) else ""
                    log.info("< %s OK %.3fs %s", short, time.monotonic() - start, detail)
                return response
            except Exception as exc:  # the one error boundary
                code, message = to_status(exc)
                if is_expected(exc):
                    log.info("< %s %s %.3fs %s", short, code.name, time.monotonic() - start, message)
                else:
                    log.exception("< %s %s %.3fs unexpected error", short, code.name, time.monotonic() - start)
                await context.abort(code, message)
                raise  # abort() raises; keeps type checkers sure this path never returns
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            finally:
                if self._observe is not None:
                    self._observe(method, code, time.monotonic() - start)
                logctx.volume_id.reset(vol)
                logctx.request_id.reset(rid)

        return call

"""The one error boundary: exception -> (gRPC status code, message).

Domain errors (``nvmeof_csi.errors.DriverError`` and subclasses) map by class to the code they carry.
Everything else is a bug: INTERNAL, with the traceback logged by the caller (the edge interceptor).
"""

from __future__ import annotations

import grpc

from nvmeof_csi.errors import DriverError


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, DriverError):
        return exc.code, str(exc) or type(exc).__name__
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def is_expected(exc: BaseException) -> bool:
    """True for errors raised on purpose (no traceback needed in the log)."""
    return isinstance(exc, DriverError)

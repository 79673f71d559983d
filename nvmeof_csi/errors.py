"""The domain exception hierarchy: every error the driver raises on purpose.

Contract: each class carries the gRPC status code the CSI spec names for it (``code``), so the one error
boundary (``nvmeof_csi.rpc.boundary``) maps an exception to a status by class, with ``isinstance``. Code below
the servicers raises these and never touches gRPC contexts. Anything that is not a ``DriverError`` is a bug
and becomes INTERNAL with its traceback logged.

    DriverError                      INTERNAL (base; use a subclass)
    ├── InvalidArgument              INVALID_ARGUMENT   bad or missing request field, unknown parameter
    ├── NotFound                     NOT_FOUND          volume / snapshot / node / path does not exist
    ├── AlreadyExists                ALREADY_EXISTS     same name, incompatible request
    ├── FailedPrecondition           FAILED_PRECONDITION state does not allow it (published, multipath off)
    ├── OutOfRange                   OUT_OF_RANGE       size outside what the backend can do
    ├── ResourceExhausted            RESOURCE_EXHAUSTED no capacity, too many volumes
    ├── Aborted                      ABORTED            an operation on the same key is in progress
    ├── PermissionDenied             PERMISSION_DENIED  the caller's identity or role does not allow the call
    ├── Unavailable                  UNAVAILABLE        a backend (agent, Alluxio, kernel) cannot be reached
    ├── DeadlineExceeded             DEADLINE_EXCEEDED  a bounded wait ran out
    ├── Unimplemented                UNIMPLEMENTED      capability not offered
    └── CommandError                 INTERNAL           a host command failed (argv, rc, stdout, stderr)

    ConfigError (a ValueError)       a setting or configuration file is invalid: the commands exit 2
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc


class DriverError(Exception):
    """Base of all intended errors; ``code`` is the gRPC status the boundary returns."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is accepted."""


class InvalidArgument(DriverError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DriverError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DriverError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(DriverError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(DriverError):
    code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhausted(DriverError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class SlotsBusy(ResourceExhausted):
    """Every slot of a bounded kind of work (a dataset fill) is taken now: nothing was started; retry later."""


class Aborted(DriverError):
    code = grpc.StatusCode.ABORTED


class PermissionDenied(DriverError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(DriverError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(DriverError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(DriverError):
    code = grpc.StatusCode.UNIMPLEMENTED


class CommandError(DriverError):
    """A host command exited non-zero or timed out. ``argv`` is already redacted."""

    def __init__(self, argv: Sequence[str], rc: int, out: str, err: str) -> None:
        self.argv = list(argv)
        self.rc = rc
        self.out = out
        self.err = err
        detail = (err or out).strip().splitlines()
        super().__init__(f"{' '.join(self.argv)} exited {rc}: {detail[-1] if detail else 'no output'}")


def error_for(code: grpc.StatusCode, message: str) -> DriverError:
    """The domain error for a status a peer returned (the reverse of the boundary's mapping)."""
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        OutOfRange,
        ResourceExhausted,
        Aborted,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
        Unimplemented,
    ):
        if cls.code == code:
            return cls(message)
    return DriverError(f"{code.name}: {message}")

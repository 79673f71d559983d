"""Small helpers shared by the servicers: required fields, deadlines, running blocking work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from nvmeof_csi.errors import InvalidArgument

T = TypeVar("T")
DEFAULT_TIMEOUT = 120.0
MIN_TIMEOUT = 1.0


def require(value: Any, field: str) -> None:
    """Raise INVALID_ARGUMENT naming ``field`` when it is empty."""
    if not value:
        raise InvalidArgument(f"{field} is required")


def remaining(context: grpc.aio.ServicerContext[Any, Any]) -> float:
    """Seconds left before the caller's deadline (a default when it set none), never below one second."""
    left = context.time_remaining()
    if left is None:
        return DEFAULT_TIMEOUT
    return max(MIN_TIMEOUT, float(left))


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking service code in a worker thread (contextvars are copied, so logs keep their IDs)."""
    return await asyncio.to_thread(fn, *args)

"""CSI Identity service."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.wrappers_pb2 import BoolValue

from nvmeof_csi import DRIVER_NAME, __version__
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.service.contracts import Health

Ctx = grpc.aio.ServicerContext[Any, Any]
Service = csi_pb2.PluginCapability.Service


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    """Plugin info, capabilities by mode, and a Probe that is ready only when every backend answers."""

    def __init__(self, controller: bool, checks: Sequence[Callable[[], Health]]) -> None:
        self._controller = controller
        self._checks = list(checks)
        # Probe has threads of its own: it answers even while long RPCs occupy every shared worker thread.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe")

    async def GetPluginInfo(self, request: csi_pb2.GetPluginInfoRequest, context: Ctx) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

    async def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: Ctx
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        caps = []
        if self._controller:
            for kind in (Service.CONTROLLER_SERVICE, Service.VOLUME_ACCESSIBILITY_CONSTRAINTS):
                caps.append(csi_pb2.PluginCapability(service=Service(type=kind)))
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=caps)

    async def Probe(self, request: csi_pb2.ProbeRequest, context: Ctx) -> csi_pb2.ProbeResponse:
        ready = True
        loop = asyncio.get_running_loop()
        for check in self._checks:
            health = await loop.run_in_executor(self._pool, contextvars.copy_context().run, check)
            ready = ready and health.ready
        return csi_pb2.ProbeResponse(ready=BoolValue(value=ready))

"""Kubelet plugin registration served by the node plugin itself (``pluginregistration.v1``), for clusters
where node-driver-registrar cannot be had (our Kubernetes tier); real clusters keep the registrar sidecar.

Kubelet watches its ``plugins_registry`` folder; for a new socket there it calls ``GetInfo`` (we answer: a
``CSIPlugin`` named after the driver, the CSI endpoint as kubelet sees it, version ``1.0.0``) and then
``NotifyRegistrationStatus``.

Contract: :class:`KubeletRegistration.run` serves ``<dir>/<driver>-reg.sock`` until ``stop`` is set, then
removes it. A failed registration (``plugin_registered`` false) is logged with kubelet's error and retried
after a growing pause (1 s doubling up to 60 s): the socket is made anew, which kubelet sees as a new plugin.
``registered`` tells whether kubelet last reported success.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc

from nvmeof_csi.gen import pluginregistration_pb2 as pb
from nvmeof_csi.gen import pluginregistration_pb2_grpc as pb_grpc
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import claim_socket

log = logging.getLogger(__name__)
PLUGIN_TYPE = "CSIPlugin"
SUPPORTED_VERSIONS = ("1.0.0",)
FIRST_RETRY, LAST_RETRY = 1.0, 60.0
STOP_GRACE = 2.0
Ctx = grpc.aio.ServicerContext[Any, Any]


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, driver: str, csi_endpoint: str, failed: asyncio.Event, registered: asyncio.Event) -> None:
        self._driver, self._endpoint = driver, csi_endpoint
        self._failed, self._registered = failed, registered

    async def GetInfo(self, request: pb.InfoRequest, context: Ctx) -> pb.PluginInfo:
        return pb.PluginInfo(
            type=PLUGIN_TYPE, name=self._driver, endpoint=self._endpoint, supported_versions=list(SUPPORTED_VERSIONS)
        )

    async def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: Ctx
    ) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered %s (CSI endpoint %s)", self._driver, self._endpoint)
            self._registered.set()
        else:
            log.error("kubelet refused to register %s: %s", self._driver, request.error or "no reason given")
            self._registered.clear()
            self._failed.set()
        return pb.RegistrationStatusResponse()


class KubeletRegistration:
    def __init__(self, folder: Path, driver: str, csi_endpoint: str) -> None:
        """``csi_endpoint``: the CSI socket's path as kubelet (on the host) sees it."""
        self.socket = folder / f"{driver}-reg.sock"
        self._driver, self._endpoint = driver, csi_endpoint
        self.registered = asyncio.Event()

    async def _serve_once(self, failed: asyncio.Event) -> grpc.aio.Server:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer(self._driver, self._endpoint, failed, self.registered), server
        )
        claim_socket(self.socket)
        server.add_insecure_port(Endpoint.parse(f"unix://{self.socket}").grpc_address)
        await server.start()
        log.info("kubelet registration socket %s ready", self.socket)
        return server

    async def run(self, stop: asyncio.Event) -> None:
        pause = FIRST_RETRY
        while not stop.is_set():
            failed = asyncio.Event()
            server = await self._serve_once(failed)
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(failed.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
                await server.stop(STOP_GRACE)  # kubelet's NotifyRegistrationStatus call gets its answer
                self.socket.unlink(missing_ok=True)
            if stop.is_set():
                return
            log.info("registering with kubelet again in %.0f s", pause)
            try:
                await asyncio.wait_for(stop.wait(), pause)
                return
            except TimeoutError:
                pass
            pause = min(pause * 2, LAST_RETRY)

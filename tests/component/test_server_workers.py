"""``--workers``: the CSI calls' blocking work runs on a pool of exactly that many threads, so a controller that
many claims reach at once holds that many agent calls in flight (not asyncio's default, CPUs + 4)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import grpc

from nvmeof_csi.csi.server import serve
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.service.contracts import Volume
from tests.support.fakes import FakeBackend
from tests.support.requests import mount_cap
from tests.support.stack import make_services


class Held(FakeBackend):
    """Each create waits for ``gate``; the threads inside at once are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.gate = self.release
        self.inside: set[str] = set()
        self.most = 0
        self._lock = threading.Lock()

    def create_volume(self, name: str, capacity_bytes: int, parameters: VolumeParameters, *a: Any, **k: Any) -> Volume:
        with self._lock:
            self.inside.add(threading.current_thread().name)
            self.most = max(self.most, len(self.inside))
        try:
            return super().create_volume(name, capacity_bytes, parameters, *a, **k)
        finally:
            with self._lock:
                self.inside.discard(threading.current_thread().name)


async def test_blocking_work_runs_on_exactly_the_workers_set(tmp_path: Path) -> None:
    backend = Held()
    services, _, _ = make_services(tmp_path, backend)
    services.workers = 3
    sock = tmp_path / "csi.sock"
    stop = asyncio.Event()
    server = asyncio.ensure_future(serve(services, Endpoint.parse(f"unix://{sock}"), 5.0, stop=stop))
    while not sock.exists():
        await asyncio.sleep(0.02)
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = csi_pb2_grpc.ControllerStub(channel)
        calls = [
            asyncio.ensure_future(
                stub.CreateVolume(
                    csi_pb2.CreateVolumeRequest(name=f"v{i}", volume_capabilities=[mount_cap()]), timeout=30
                )
            )
            for i in range(7)  # more than asyncio's default pool holds on a 2-CPU machine (6)
        ]
        while len(backend.inside) < 3:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # a fourth thread, if the pool had one, would be inside by now
        assert backend.most == 3
        assert all(name.startswith("csi-work") for name in backend.inside)
        backend.release.set()
        done = await asyncio.gather(*calls)
    assert len({r.volume.volume_id for r in done}) == 7
    stop.set()
    await asyncio.wait_for(server, 10)

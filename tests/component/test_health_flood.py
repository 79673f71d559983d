"""A flood of liveness probes costs one check at a time: 256 concurrent ``GET /healthz`` all get their answer
while the checks never run more than once at a time (before, each request took a thread of the pool the CSI
calls run on, so a flood starved the Probe workers into liveness restarts)."""

from __future__ import annotations

import asyncio
import threading
import time

from nvmeof_csi.csi.health import serve_health
from nvmeof_csi.service.contracts import Health
from tests.component.test_kubelet_registration import _free_port, _http


async def test_256_concurrent_probes_run_the_checks_one_at_a_time() -> None:
    running, most, calls = [0], [0], [0]
    lock = threading.Lock()

    def slow_check() -> Health:
        with lock:
            running[0] += 1
            calls[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return Health(True)

    port, stop = _free_port(), asyncio.Event()
    server = asyncio.create_task(serve_health(f"127.0.0.1:{port}", [slow_check], stop))
    try:
        for _ in range(50):
            try:
                await _http(port, "/nothing")
                break
            except OSError:
                await asyncio.sleep(0.1)
        answers = await asyncio.gather(*(_http(port, "/healthz") for _ in range(256)))
    finally:
        stop.set()
        await asyncio.wait_for(server, 15)
    assert answers == [(200, "ok")] * 256
    assert most[0] == 1, most  # never two evaluations at once
    assert calls[0] < 256 / 4, calls  # most requests shared a running evaluation

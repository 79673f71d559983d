"""What runs beside the server is built by the wiring and started and stopped by ``serve``: building starts no
thread, serving starts the loops, and a served process that stops leaves none of them behind."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from nvmeof_csi.cmd.settings import Backend, Mode, Settings
from nvmeof_csi.cmd.wiring import build_services
from nvmeof_csi.csi.server import serve
from nvmeof_csi.rpc.background import Background, Loop
from nvmeof_csi.rpc.endpoints import Endpoint


def _names() -> set[str]:
    return {t.name for t in threading.enumerate() if t.is_alive()}


def test_loops_start_in_order_and_stop_in_reverse(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    background = Background()

    def loop(name: str) -> Loop:
        def run(stop: threading.Event) -> None:
            seen.append(f"start {name}")
            stop.wait()
            seen.append(f"stop {name}")

        return run

    background.add("bg-a", loop("a"))
    background.add("bg-b", loop("b"))

    def broken(_stop: threading.Event) -> None:
        raise ZeroDivisionError

    background.add("bg-broken", broken)
    assert "bg-a" not in _names(), "adding a loop must not run it"
    background.start()
    with pytest.raises(RuntimeError):
        background.start()
    assert background.stop() == []
    assert {n for n in _names() if n.startswith("bg-")} == set()
    assert sorted(seen[:2]) == ["start a", "start b"] and sorted(seen[2:]) == ["stop a", "stop b"]
    assert "background bg-broken ended with an error" in caplog.text
    deaf = Background()
    gate = threading.Event()

    def deaf_loop(_stop: threading.Event) -> None:
        gate.wait()

    deaf.add("bg-deaf", deaf_loop)
    deaf.start()
    assert deaf.stop(timeout=0.2) == ["bg-deaf"]  # reported, not waited on for ever
    gate.set()


async def test_a_served_controller_runs_its_census_only_while_serving(tmp_path: Path) -> None:
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(
        "agents:\n  - {name: store-a, endpoint: unix:///" + str(tmp_path / "nobody.sock").lstrip("/") + ", "
        "fabric: f1, zone: z1}\n"
    )
    sock = tmp_path / "csi.sock"
    settings = Settings(
        mode=Mode.CONTROLLER,
        backend=Backend.NVMEOF,
        fabric_map=fabric,
        kubeconfig="none",
        state_dir=tmp_path / "state",
        endpoint=Endpoint.parse(f"unix://{sock}"),
    )
    services = build_services(settings)
    assert [name for name, _ in services.background.loops] == ["name-census"]
    assert "name-census" not in _names(), "build_services started a thread"
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve(services, settings.endpoint, 1.0, stop))
    for _ in range(200):
        if sock.exists() and "name-census" in _names():
            break
        await asyncio.sleep(0.02)
    assert "name-census" in _names(), "serve did not start the census"
    stop.set()
    await asyncio.wait_for(task, 15)
    assert "name-census" not in _names(), "the census outlived the server"

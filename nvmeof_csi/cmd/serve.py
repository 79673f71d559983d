"""``nvmeof-csi serve``: flags (made from :class:`Settings`' declarations) -> :class:`Settings` ->
:func:`build_services` -> the CSI server. The services' modules
are imported when the command runs, so another command's process never loads them."""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from nvmeof_csi import DRIVER_NAME
from nvmeof_csi.cmd.exits import run_or_exit, settings_or_exit
from nvmeof_csi.cmd.flags import command_parameters, settings_from
from nvmeof_csi.cmd.settings import Backend, Settings
from nvmeof_csi.rpc import logctx

if TYPE_CHECKING:
    from nvmeof_csi.csi.registration import KubeletRegistration

log = logging.getLogger("nvmeof_csi")


def serve_command(**values: Any) -> None:
    """Run the CSI gRPC server (controller, node or both) until SIGTERM."""
    settings: Settings = settings_or_exit("nvmeof-csi", lambda: settings_from(Settings, values))
    logctx.install(settings.log_level)
    if settings.backend is Backend.LOOP:
        log.warning("backend 'loop' is for DEVELOPMENT ONLY: no durability, no access control")
    from nvmeof_csi.csi.registration import KubeletRegistration  # noqa: PLC0415 - see the module docstring

    registration = None
    if settings.registration_dir is not None:
        registration = KubeletRegistration(settings.registration_dir, DRIVER_NAME, settings.registration_endpoint)
    run_or_exit("nvmeof-csi", lambda: _serve(settings, registration))


serve_command.__signature__ = inspect.Signature(command_parameters(Settings))  # type: ignore[attr-defined]


async def _serve(settings: Settings, registration: KubeletRegistration | None) -> None:
    from nvmeof_csi.cmd.wiring import build_services  # noqa: PLC0415 - see the module docstring
    from nvmeof_csi.csi.server import serve as serve_grpc  # noqa: PLC0415
    from nvmeof_csi.rpc.metrics import serve_metrics  # noqa: PLC0415

    services = build_services(settings)
    if settings.metrics_listen:
        serve_metrics(settings.metrics_listen, services.registry)
    await serve_grpc(
        services,
        settings.endpoint,
        settings.grace_seconds,
        registration=registration,
        health_listen=settings.health_listen,
    )

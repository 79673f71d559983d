"""``nvmeof-csi serve``: flags -> :class:`Settings` -> :func:`build_services` -> the CSI server. The services' modules
are imported when the command runs, so another command's process never loads them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nvmeof_csi import DRIVER_NAME
from nvmeof_csi.cmd.exits import run_or_exit, settings_or_exit
from nvmeof_csi.cmd.settings import Backend, Mode, Settings, env_var, parse_size
from nvmeof_csi.rpc import logctx
from nvmeof_csi.rpc.endpoints import Endpoint

if TYPE_CHECKING:
    from nvmeof_csi.csi.registration import KubeletRegistration

log = logging.getLogger("nvmeof_csi")


def serve_command(
    mode: Annotated[Mode, typer.Option(envvar=env_var("MODE"), help="Which CSI services to run.")] = Mode.ALL,
    endpoint: Annotated[
        str, typer.Option(envvar=env_var("ENDPOINT"), help="unix:///path/csi.sock or tcp://127.0.0.1:PORT")
    ] = "unix:///run/nvmeof-csi/csi.sock",
    backend: Annotated[
        Backend, typer.Option(envvar=env_var("BACKEND"), help="Storage backend. 'loop' is DEVELOPMENT ONLY.")
    ] = Backend.LOOP,
    state_dir: Annotated[
        Path, typer.Option(envvar=env_var("STATE_DIR"), help="Where volumes (loop) and staging records live.")
    ] = Path("/var/lib/nvmeof-csi"),
    node_id: Annotated[str, typer.Option(envvar=env_var("NODE_ID"), help="Node ID (default: hostname).")] = "",
    fabric: Annotated[
        str, typer.Option(envvar=env_var("FABRIC"), help="Storage fabric domain of this node (topology).")
    ] = "default",
    loop_capacity: Annotated[
        str, typer.Option(envvar=env_var("LOOP_CAPACITY"), help="Capacity the loop backend offers, e.g. 1T.")
    ] = "1T",
    max_volumes_per_node: Annotated[
        int, typer.Option(envvar=env_var("MAX_VOLUMES_PER_NODE"), help="0 = no limit.")
    ] = 0,
    grace_seconds: Annotated[
        float, typer.Option(envvar=env_var("GRACE_SECONDS"), help="Time in-flight RPCs get on SIGTERM.")
    ] = 30.0,
    log_level: Annotated[str, typer.Option(envvar=env_var("LOG_LEVEL"), help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
    fabric_map: Annotated[
        Path | None, typer.Option(envvar=env_var("FABRIC_MAP"), help="Target agents (YAML) for backend nvmeof.")
    ] = None,
    zone: Annotated[str, typer.Option(envvar=env_var("ZONE"), help="This node's topology.kubernetes.io/zone.")] = "",
    allow_single_path: Annotated[
        bool, typer.Option(help="Stage multi-portal volumes over one path when native multipath is off.")
    ] = False,
    alluxio_proxy: Annotated[
        str, typer.Option(envvar=env_var("ALLUXIO_PROXY"), help="Alluxio REST proxy URL: place dataset volumes "
                          "next to the worker caching their data set (fabric map alluxioHost).")
    ] = "",
    kubelet_root: Annotated[
        Path, typer.Option(envvar=env_var("KUBELET_ROOT"), help="The node touches staging and target paths "
                           "only under this folder (kubelet's root directory).")
    ] = Path("/var/lib/kubelet"),
    registration_dir: Annotated[
        Path | None, typer.Option(envvar=env_var("REGISTRATION_DIR"), help="Register with kubelet ourselves through "
                                  "its plugins_registry folder (where node-driver-registrar cannot run).")
    ] = None,
    registration_endpoint: Annotated[
        str, typer.Option(envvar=env_var("REGISTRATION_ENDPOINT"), help="The CSI socket's path as kubelet sees it "
                          "(default: the --endpoint path).")
    ] = "",
    health_listen: Annotated[
        str, typer.Option(envvar=env_var("HEALTH_LISTEN"), help="HOST:PORT for GET /healthz (the Probe checks) "
                          "where the livenessprobe sidecar cannot run ('' = off).")
    ] = "",
    metrics_listen: Annotated[
        str, typer.Option(envvar=env_var("METRICS_LISTEN"), help="HOST:PORT for Prometheus /metrics: RPC durations "
                          "(csi_plugin_operations_seconds) and, on nodes, per-volume paths and I/O ('' = off).")
    ] = "",
    qos_period: Annotated[
        float, typer.Option(envvar=env_var("QOS_PERIOD"), help="Seconds between the node's passes that bring every "
                            "published pod's io.max to its volume's current limits.")
    ] = 5.0,
    cgroup_root: Annotated[
        Path, typer.Option(envvar=env_var("CGROUP_ROOT"), help="The cgroup v2 mount holding kubelet's pod cgroups.")
    ] = Path("/sys/fs/cgroup"),
) -> None:
    """Run the CSI gRPC server (controller, node or both) until SIGTERM."""
    settings = settings_or_exit("nvmeof-csi", lambda: Settings(
            mode=mode,
            endpoint=Endpoint.parse(endpoint),
            backend=backend,
            state_dir=state_dir.absolute(),
            node_id=node_id,
            fabric=fabric,
            loop_capacity_bytes=parse_size(loop_capacity),
            max_volumes_per_node=max_volumes_per_node,
            grace_seconds=grace_seconds,
            log_level=log_level,
            fabric_map=fabric_map,
            zone=zone,
            allow_single_path=allow_single_path,
            alluxio_proxy=alluxio_proxy,
            kubelet_root=kubelet_root.absolute(),
            registration_dir=registration_dir,
            registration_endpoint=registration_endpoint,
            health_listen=health_listen,
            metrics_listen=metrics_listen,
            qos_period=qos_period,
            cgroup_root=cgroup_root,
    ))
    logctx.install(settings.log_level)
    if settings.backend is Backend.LOOP:
        log.warning("backend 'loop' is for DEVELOPMENT ONLY: no durability, no access control")
    from nvmeof_csi.csi.registration import KubeletRegistration  # noqa: PLC0415 - see the module docstring

    registration = None
    if settings.registration_dir is not None:
        registration = KubeletRegistration(settings.registration_dir, DRIVER_NAME, settings.registration_endpoint)
    run_or_exit("nvmeof-csi", lambda: _serve(settings, registration))


async def _serve(settings: Settings, registration: KubeletRegistration | None) -> None:
    from nvmeof_csi.cmd.wiring import build_services  # noqa: PLC0415 - see the module docstring
    from nvmeof_csi.csi.server import serve as serve_grpc  # noqa: PLC0415
    from nvmeof_csi.rpc.metrics import serve_metrics  # noqa: PLC0415

    services = build_services(settings)
    if settings.metrics_listen:
        serve_metrics(settings.metrics_listen, services.registry)
    await serve_grpc(services, settings.endpoint, settings.grace_seconds,
                     registration=registration, health_listen=settings.health_listen)

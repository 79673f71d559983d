"""``nvmeofctl driver``: ask a running driver (any mode) who it is, what it offers and whether it is ready."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import grpc
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nvmeof_csi.errors import ConfigError
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.rpc.endpoints import Endpoint

app = typer.Typer(help="Inspect a running nvmeof-csi driver over its CSI socket.", no_args_is_help=True)


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


def _collect(endpoint: Endpoint, timeout: float) -> dict[str, Any]:
    with grpc.insecure_channel(endpoint.grpc_address) as channel:
        identity = csi_pb2_grpc.IdentityStub(channel)
        info = identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=timeout)
        plugin = identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=timeout)
        probe = identity.Probe(csi_pb2.ProbeRequest(), timeout=timeout)
        facts: dict[str, Any] = {
            "name": info.name,
            "version": info.vendor_version,
            "ready": probe.ready.value if probe.HasField("ready") else True,
            "plugin_capabilities": [
                csi_pb2.PluginCapability.Service.Type.Name(c.service.type) for c in plugin.capabilities
            ],
        }
        try:
            ctrl = csi_pb2_grpc.ControllerStub(channel).ControllerGetCapabilities(
                csi_pb2.ControllerGetCapabilitiesRequest(), timeout=timeout
            )
            facts["controller_capabilities"] = [
                csi_pb2.ControllerServiceCapability.RPC.Type.Name(c.rpc.type) for c in ctrl.capabilities
            ]
        except grpc.RpcError:
            facts["controller_capabilities"] = []
        try:
            node = csi_pb2_grpc.NodeStub(channel)
            ncaps = node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=timeout)
            ninfo = node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=timeout)
            facts["node_capabilities"] = [
                csi_pb2.NodeServiceCapability.RPC.Type.Name(c.rpc.type) for c in ncaps.capabilities
            ]
            facts["node_id"] = ninfo.node_id
            facts["topology"] = dict(ninfo.accessible_topology.segments)
        except grpc.RpcError:
            facts["node_capabilities"] = []
        return facts


@app.command()
def info(
    endpoint: Annotated[
        str, typer.Option(envvar="NVMEOF_CSI_ENDPOINT", help="unix:///path/csi.sock or tcp://HOST:PORT")
    ] = "unix:///run/nvmeof-csi/csi.sock",
    output: Annotated[Output, typer.Option("--output", "-o", help="table or json")] = Output.TABLE,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each RPC.")] = 10.0,
) -> None:
    """Show the driver's name, version, readiness (Probe), capabilities and node facts."""
    try:
        facts = _collect(Endpoint.parse(endpoint), timeout)
    except ConfigError as err:
        typer.echo(f"nvmeofctl: {err}", err=True)
        raise typer.Exit(2) from err
    except grpc.RpcError as err:
        typer.echo(f"nvmeofctl: {endpoint}: {err.code().name}: {err.details()}", err=True)
        raise typer.Exit(1) from err
    if output is Output.JSON:
        typer.echo(json.dumps(facts, indent=1, sort_keys=True))
        return
    table = Table(title=Text(f"{facts['name']} {facts['version']} at {endpoint}"))
    table.add_column("fact")
    table.add_column("value")
    for key, value in facts.items():  # Text: what the driver answered is shown as it is, never read as markup
        table.add_row(Text(key), Text(", ".join(value) if isinstance(value, list) else str(value)))
    Console().print(table)

"""``nvmeof-csi agent``: flags -> :class:`AgentSettings` -> :func:`serve_agent`. The agent's modules are imported when
the command runs, so another command's process never loads them (start-up time on a busy node)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi.cmd.exits import run_or_exit, settings_or_exit
from nvmeof_csi.cmd.settings import AgentSettings, env_var, parse_size
from nvmeof_csi.rpc import logctx
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles


def agent_command(
    name: Annotated[str, typer.Option(envvar=env_var("AGENT_NAME"), help="Agent name (DNS label, in volume IDs).")],
    portal: Annotated[
        list[str],
        typer.Option(envvar=env_var("AGENT_PORTALS"), help="Portal ID:TRTYPE:TRADDR:TRSVCID[:GROUP], repeatable."),
    ],
    state_dir: Annotated[
        Path, typer.Option(envvar=env_var("AGENT_STATE_DIR"), help="Where desired state is saved (durable).")
    ] = Path("/var/lib/nvmeof-csi/agent"),
    pool_dir: Annotated[
        Path, typer.Option(envvar=env_var("AGENT_POOL_DIR"), help="Backing-file pool (XFS with reflink recommended).")
    ] = Path("/var/lib/nvmeof-csi/pool"),
    listen_unix: Annotated[
        str, typer.Option(envvar=env_var("AGENT_LISTEN_UNIX"), help="unix:///path socket ('' to disable).")
    ] = "unix:///run/nvmeof-csi/agent.sock",
    listen_tcp: Annotated[
        str, typer.Option(envvar=env_var("AGENT_LISTEN_TCP"), help="tcp://HOST:PORT, served with mutual TLS.")
    ] = "",
    tls_cert: Annotated[Path | None, typer.Option(envvar=env_var("AGENT_TLS_CERT"), help="Server cert (PEM).")] = None,
    tls_key: Annotated[Path | None, typer.Option(envvar=env_var("AGENT_TLS_KEY"), help="Server key (PEM).")] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(envvar=env_var("AGENT_TLS_CA"), help="CA that signs accepted clients (PEM).")
    ] = None,
    allow_plaintext_loopback: Annotated[
        bool, typer.Option(help="Allow TCP without TLS, on a loopback address only (tests).")
    ] = False,
    prune: Annotated[bool, typer.Option(help="Remove configfs objects and pool files the state lacks.")] = False,
    capacity_limit: Annotated[
        str, typer.Option(envvar=env_var("AGENT_CAPACITY_LIMIT"), help="Thin-provisioning limit, e.g. 10T (0 = pool).")
    ] = "0",
    configfs_root: Annotated[Path, typer.Option(help="nvmet configfs root.")] = Path("/sys/kernel/config/nvmet"),
    configfs_plain_tree: Annotated[
        bool, typer.Option(hidden=True, help="TESTS ONLY: configfs-root is a plain folder standing in for configfs.")
    ] = False,
    buffered_io: Annotated[bool, typer.Option(help="Use the page cache for backing files (needed on tmpfs).")] = False,
    grace_seconds: Annotated[float, typer.Option(envvar=env_var("GRACE_SECONDS"), help="SIGTERM grace.")] = 30.0,
    log_level: Annotated[str, typer.Option(envvar=env_var("LOG_LEVEL"), help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
    alluxio_proxy: Annotated[
        str, typer.Option(envvar=env_var("ALLUXIO_PROXY"), help="Alluxio REST proxy URL (dataset volumes).")
    ] = "",
    alluxio_job: Annotated[
        str, typer.Option(envvar=env_var("ALLUXIO_JOB"), help="Alluxio job master web URL (cache load jobs).")
    ] = "",
    authz_file: Annotated[
        Path | None, typer.Option(envvar=env_var("AGENT_AUTHZ_FILE"), help="YAML policy mapping client certificate "
                                  "identities to roles (controller, node, admin, reader); needed with --listen-tcp.")
    ] = None,
    dataset_ufs_allow: Annotated[
        list[str], typer.Option(envvar=env_var("AGENT_DATASET_UFS_ALLOW"), help="Under-store prefix dataset.uri may "
                                "name (repeatable; none by default, so only data sets already in Alluxio are used).")
    ] = [],  # noqa: B006 -- typer reads the default, never mutates it
    dataset_root: Annotated[
        str, typer.Option(envvar=env_var("AGENT_DATASET_ROOT"), help="Alluxio folder every dataset.path must be in.")
    ] = "/datasets",
    metrics_listen: Annotated[
        str, typer.Option(envvar=env_var("METRICS_LISTEN"), help="HOST:PORT for Prometheus /metrics ('' = off).")
    ] = "",
) -> None:
    """Run the target agent of one storage node: kernel nvmet over configfs, backing files, persistent state."""
    from nvmeof_csi.agent.portals import PortSpec  # noqa: PLC0415 - only this command's process loads the agent
    from nvmeof_csi.cmd.agent_wiring import serve_agent  # noqa: PLC0415
    settings = settings_or_exit("nvmeof-csi agent", lambda: AgentSettings(
            name=name,
            state_dir=state_dir.absolute(),
            pool_dir=pool_dir.absolute(),
            portals=tuple(PortSpec.parse(p) for p in portal),
            unix_endpoint=Endpoint.parse(listen_unix) if listen_unix else None,
            tcp_endpoint=Endpoint.parse(listen_tcp) if listen_tcp else None,
            tls=TlsFiles.from_options(tls_cert, tls_key, tls_ca),
            allow_plaintext_loopback=allow_plaintext_loopback,
            prune=prune,
            capacity_limit_bytes=parse_size(capacity_limit),
            configfs_root=configfs_root,
            buffered_io=buffered_io,
            grace_seconds=grace_seconds,
            log_level=log_level,
            alluxio_proxy=alluxio_proxy,
            alluxio_job=alluxio_job,
            metrics_listen=metrics_listen,
            authz_file=authz_file,
            dataset_ufs_allow=tuple(dataset_ufs_allow),
            dataset_root=dataset_root,
    ))
    logctx.install(settings.log_level)
    run_or_exit("nvmeof-csi agent", lambda: serve_agent(settings, plain_tree=configfs_plain_tree))

"""``nvmeof-csi agent``: flags (made from :class:`AgentSettings`' declarations) -> :class:`AgentSettings` ->
:func:`serve_agent`. The agent's modules are imported when the command runs, so another command's process never
loads them (start-up time on a busy node)."""

from __future__ import annotations

import inspect
from typing import Any

from nvmeof_csi.cmd.agent_settings import AgentSettings
from nvmeof_csi.cmd.exits import run_or_exit, settings_or_exit
from nvmeof_csi.cmd.flags import command_parameters, settings_from
from nvmeof_csi.rpc import logctx


def agent_command(**values: Any) -> None:
    """Run the target agent of one storage node: kernel nvmet over configfs, backing files, persistent state."""
    from nvmeof_csi.cmd.agent_wiring import serve_agent  # noqa: PLC0415 - only this command's process loads the agent

    settings: AgentSettings = settings_or_exit("nvmeof-csi agent", lambda: settings_from(AgentSettings, values))
    logctx.install(settings.log_level)
    run_or_exit("nvmeof-csi agent", lambda: serve_agent(settings, plain_tree=settings.configfs_plain_tree))


agent_command.__signature__ = inspect.Signature(command_parameters(AgentSettings))  # type: ignore[attr-defined]

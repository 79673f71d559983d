"""The executables: each command's flags, its typed settings and the wiring that builds its parts.

The two composition roots live here (``wiring`` for ``nvmeof-csi serve``, ``agent_wiring`` for
``nvmeof-csi agent``); nothing below this package reads settings or the environment.
"""

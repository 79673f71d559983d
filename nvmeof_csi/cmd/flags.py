"""Settings declared once: each field of a settings dataclass carries its flag, environment variable, help,
default and range (:func:`setting`), and everything else is made from that declaration: the typer options of
the command (:func:`command_parameters`), the values handed to the dataclass (:func:`settings_from`), the range
check (:func:`check_ranges`) and the tables of docs/configuration.md (:func:`markdown_table`, which a unit
test compares with that document).

Contract: a field declared with ``parse`` takes the flag's text (``raw``) and holds the parsed value; its
dataclass default is the parsed flag default, so both defaults are one. A value out of its declared range
raises ``ConfigError`` naming the flag and the range.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import Annotated, Any, get_type_hints

import typer

from nvmeof_csi.errors import ConfigError

ENV_PREFIX = "NVMEOF_CSI_"


@dataclass(frozen=True)
class Flag:
    """How one setting meets the user: ``help`` (also its meaning in the docs), ``env`` (``NVMEOF_CSI_<FLAG>``; a
    string: ``NVMEOF_CSI_<env>``; False: none), ``raw`` (the flag's own type and default when ``parse`` turns
    its text into the field's value), ``low``/``high`` (the inclusive range of a number; ``low_open``: greater
    than ``low``), ``shown`` (the default as docs/configuration.md says it, when the value itself would say it badly),
    ``metavar`` (what ``--help`` shows for the value)."""

    help: str
    env: bool | str = True
    raw: tuple[type, Any] | None = None
    parse: Callable[[Any], Any] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    shown: str | None = None
    name: str = ""  # the flag's name without dashes, when not the field's (loop_capacity_bytes -> loop-capacity)
    hidden: bool = False  # left out of --help and docs/configuration.md (test-only switches)
    metavar: str | None = None


#: the default of a setting that has none: its flag must be given
REQUIRED: Any = object()


def setting(default: Any, help: str, **how: Any) -> Any:
    """A dataclass field with its :class:`Flag` (keywords as in :class:`Flag`). With ``parse``, ``default`` is the
    flag's text and the field's default is its parsed value."""
    spec = Flag(help=help, **how)
    parse = spec.parse
    if parse is not None:
        spec = Flag(**{**spec.__dict__, "raw": (spec.raw[0] if spec.raw else str, default)})
        if default is not REQUIRED:
            default = parse(default)
    if default is REQUIRED:
        return field(metadata={"flag": spec})
    return field(default=default, metadata={"flag": spec})


def flag_of(f: Field[Any]) -> Flag:
    spec = f.metadata.get("flag")
    if not isinstance(spec, Flag):
        raise TypeError(f"setting {f.name} has no flag declaration")
    return spec


def flag_name(f: Field[Any]) -> str:
    return flag_of(f).name or f.name.replace("_", "-")


def env_var(f: Field[Any]) -> str | None:
    spec = flag_of(f)
    if isinstance(spec.env, str):
        return ENV_PREFIX + spec.env
    return ENV_PREFIX + flag_name(f).upper().replace("-", "_") if spec.env else None


def command_parameters(cls: type) -> list[inspect.Parameter]:
    """The typer parameters of every declared field of ``cls``, in declaration order."""
    hints = get_type_hints(cls)
    params = []
    for f in fields(cls):
        spec = flag_of(f)
        kind, default = spec.raw if spec.raw else (hints[f.name], f.default)
        if default is MISSING or default is REQUIRED:
            default = inspect.Parameter.empty
        option = typer.Option(
            f"--{flag_name(f)}", envvar=env_var(f), help=_help(spec), hidden=spec.hidden, metavar=spec.metavar
        )
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option]
            )
        )
    return params


def settings_from(cls: type, values: Mapping[str, Any]) -> Any:
    """``cls`` built from the command's values (each declared ``parse`` applied; its errors name the flag)."""
    built = {}
    for f in fields(cls):
        spec, value = flag_of(f), values[f.name]
        if spec.parse is not None:
            try:
                value = spec.parse(value)
            except (ValueError, ConfigError) as err:
                raise ConfigError(f"--{flag_name(f)}: {err}") from None
        built[f.name] = value
    return cls(**built)


def check_ranges(settings: Any) -> None:
    """``ConfigError`` for the first declared number outside its range."""
    for f in fields(settings):
        spec, value = flag_of(f), getattr(settings, f.name)
        too_low = spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low)
        too_high = spec.high is not None and value > spec.high
        if too_low or too_high:
            raise ConfigError(f"{flag_name(f)} must be {_range(spec)}, got {value}")


def _range(spec: Flag) -> str:
    if spec.high is None:
        return f"{'more than' if spec.low_open else 'at least'} {spec.low:g}"
    if spec.low_open:
        return f"more than {spec.low:g} and at most {spec.high:g}"
    return f"within {spec.low:g}..{spec.high:g}"


def _help(spec: Flag) -> str:
    return spec.help + (f" Range: {_range(spec)}." if spec.low is not None else "")


def _shown(f: Field[Any]) -> str:
    spec = flag_of(f)
    if spec.shown is not None:
        return spec.shown
    value = spec.raw[1] if spec.raw else f.default
    if value is MISSING or value is REQUIRED:
        return "required"
    if value is None or value in ("", []):
        return "—"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def markdown_table(cls: type) -> str:
    """The configuration table of ``cls`` (docs/configuration.md): flag, environment variable, default, meaning."""
    rows = ["| flag | env | default | meaning |", "|---|---|---|---|"]
    for f in fields(cls):
        if flag_of(f).hidden:
            continue
        env = env_var(f)
        rows.append(f"| `--{flag_name(f)}` | {f'`{env}`' if env else '—'} | {_shown(f)} | {_help(flag_of(f))} |")
    return "\n".join(rows)

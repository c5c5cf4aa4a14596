"""Typed training configs: frozen dataclasses read from TOML, every key overridable on the command line.

Generic on purpose: any tree of frozen dataclasses is a config (the SFT trainer's, the RL
trainer's). A TOML table is a nested dataclass; ``--section.key VALUE`` overrides one key (the
value is read as a TOML value, or as plain text for a string). Unknown keys, missing keys, wrong
types and failed value checks (a dataclass's ``__post_init__`` raising ``ValueError``) all raise
``ConfigError``: one line that names the key, before any work starts. Every number is checked
here whatever its field: a float must be finite (``1e400`` reads as infinity; ``nan`` and ``inf``
are valid TOML) and an integer must fit in 64 bits; each dataclass then checks its own ranges.

Supported field types: ``bool``, ``int``, ``float`` (an integer is accepted), ``str``,
``Literal[...]``, ``tuple[T, ...]``/``tuple[T, U]``/``list[T]``, a nested dataclass, a free-form
table ``dict[str, Any]`` (an environment's arguments), and any of these ``| None`` (``None`` is written as an absent key, or ``none`` on the command line).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class ConfigError(ValueError):
    """A config that cannot be used: one line naming the key and what is wrong."""


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Mapping[str, str] | None = None
) -> T:
    """``cls`` built from the TOML file at ``path`` (optional), then ``overrides`` (``"a.b"`` → text)."""
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the config file {path}: {exc}") from None
        data = _read_toml(text, str(path))
    for key, text in (overrides or {}).items():
        set_override(cls, data, key, text)
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _read_toml(text: str, what: str) -> dict[str, Any]:
    """Parsed TOML, or ConfigError: tomllib raises ``ValueError`` past 4,300 digits and
    ``RecursionError`` for arrays nested a thousand deep, besides its own ``TOMLDecodeError``."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply") from None
    except ValueError as exc:  # TOMLDecodeError is one
        raise ConfigError(f"{what} is not valid TOML: {exc}") from None


def parse_overrides(tokens: Sequence[str]) -> dict[str, str]:
    """``["--optim.lr", "1e-4", "--train.steps=20"]`` → ``{"optim.lr": "1e-4", "train.steps": "20"}``."""
    out: dict[str, str] = {}
    rest = list(tokens)
    while rest:
        token = rest.pop(0)
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(f"expected --section.key VALUE, got {token!r}")
        key, eq, value = token[2:].partition("=")
        if not eq:
            if not rest:
                raise ConfigError(f"--{key} needs a value")
            value = rest.pop(0)
        out[key] = value
    return out


def set_override(cls: type, data: dict[str, Any], key: str, text: str) -> None:
    """Put ``--key text`` into ``data`` (the parsed TOML), read as the type of that field of ``cls``."""
    *tables, name = key.split(".")
    here, node = cls, data
    for i, table in enumerate(tables):
        hint = _field_types(here).get(table)
        inner = _dataclass_of(hint)
        if inner is None:
            raise ConfigError(f"unknown section --{'.'.join(tables[: i + 1])} ({_known(here, tables[:i])})")
        node = node.setdefault(table, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--{key}: {'.'.join(tables[: i + 1])} is not a table in the config file")
        here = inner
    hints = _field_types(here)
    if name not in hints:
        raise ConfigError(f"unknown key --{key} ({_known(here, tables)})")
    node[name] = _parse_text(text, hints[name], key)


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from plain data (a parsed TOML table), checking every key and type."""
    hints = _field_types(cls)
    unknown = [k for k in data if k not in hints]
    if unknown:
        raise ConfigError(
            f"unknown key {_join(where, unknown[0])} ({_known(cls, where.split('.') if where else [])})"
        )
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # callers pass dataclasses only
        key = _join(where, field.name)
        if field.name in data:
            values[field.name] = _convert(data[field.name], hints[field.name], key)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing key {key}")
    try:
        return cls(**values)
    except ValueError as exc:  # the dataclass's own value checks
        raise ConfigError(f"{where + ': ' if where else ''}{exc}") from None


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain data (tuples as lists, ``None`` dropped): what ``from_dict`` reads back."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            out[field.name] = to_dict(value)
        elif isinstance(value, (list, tuple)):
            out[field.name] = [to_dict(v) if dataclasses.is_dataclass(v) else v for v in value]
        elif value is not None:
            out[field.name] = value
    return out


def to_toml(config: Any) -> str:
    """A config as TOML text that ``load_config`` reads back to an equal config."""
    lines: list[str] = []
    _write_table(to_dict(config), [], lines)
    return "\n".join(lines).strip() + "\n"


# -- types --------------------------------------------------------------------------------------


def _field_types(cls: Any) -> dict[str, Any]:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return {}
    return typing.get_type_hints(cls)


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass in ``hint`` (``D`` or ``D | None``), else None."""
    for option in _options(hint):
        if isinstance(option, type) and dataclasses.is_dataclass(option):
            return option
    return None


def _options(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None)) + " or none"
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if origin in (list, tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} ({', '.join(_describe(a) for a in args)})"
        return f"a list of {_describe(args[0])}"
    if (isinstance(hint, type) and dataclasses.is_dataclass(hint)) or hint is dict or origin is dict:
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _convert(value: Any, hint: Any, key: str) -> Any:
    """``value`` (parsed TOML) as type ``hint``, or ConfigError naming ``key``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
        table = _dataclass_of(hint)
        if table is not None and isinstance(value, Mapping):  # an optional table: its own errors name the key
            return from_dict(table, value, key)
        closest: ConfigError | None = None  # the error of the option of the value's own kind
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, key)
            except ConfigError as exc:
                if _same_kind(value, option):
                    closest = exc
        raise closest or _wrong(value, hint, key)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise _wrong(value, hint, key)
        return from_dict(hint, value, key)
    if hint is dict or origin is dict:  # a free-form table, e.g. an environment's arguments
        if not isinstance(value, Mapping):
            raise _wrong(value, hint, key)
        return dict(value)
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        raise _wrong(value, hint, key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _wrong(value, hint, key)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _wrong(value, hint, key)
            return tuple(
                _convert(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
            )
        items = [_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not INT_MIN <= value <= INT_MAX:  # TOML's integers are 64-bit; torch's seeds and sizes too
                raise ConfigError(
                    f"{key} must be an integer between -2**63 and 2**63 - 1, got {_clip(str(value))}"
                )
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer past float's range
                number = math.inf
            if not math.isfinite(number):  # 1e400 reads as inf; nan and inf are valid TOML
                shown = value if isinstance(value, float) else f"an integer of {len(str(abs(value)))} digits"
                raise ConfigError(f"{key} must be a finite number, got {shown}")
            return number
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"config field {key} has a type the loader does not support: {hint}")
    raise _wrong(value, hint, key)


def _same_kind(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the kind ``hint`` takes, so that its error (a range, say) is the one to show."""
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typing.get_origin(hint) in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(hint, type) and isinstance(value, hint)


def _wrong(value: Any, hint: Any, key: str) -> ConfigError:
    shown = _clip(
        json.dumps(value, default=str) if not isinstance(value, float) or math.isfinite(value) else str(value)
    )
    return ConfigError(f"{key} must be {_describe(hint)}, got {shown} ({type(value).__name__})")


def _parse_text(text: str, hint: Any, key: str) -> Any:
    """A command-line value: ``none`` for an optional field, else a TOML value, else plain text."""
    options = _options(hint)
    if text.strip().lower() in ("none", "null") and type(None) in options:
        return None
    try:
        return _read_toml(f"v = {text}", f"--{key}")["v"]
    except ConfigError as exc:
        if any(_accepts_text(o) for o in options):
            return text  # a bare word for a string field: --model.path smollm2
        if "nested too deeply" in str(exc):
            raise
        raise ConfigError(f"--{key} must be {_describe(hint)}, got {_clip(text)!r}") from None


def _clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for an error message (a value can be megabytes)."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def _accepts_text(hint: Any) -> bool:
    if hint is str:
        return True
    return typing.get_origin(hint) is Literal and any(isinstance(a, str) for a in typing.get_args(hint))


def _known(cls: Any, path: Sequence[str]) -> str:
    names = ", ".join(_field_types(cls))
    return f"{'.'.join(path) or 'the config'} has: {names}"


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# -- writing TOML -------------------------------------------------------------------------------


def _write_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    if path and (scalars or not table):
        lines.append(f"\n[{'.'.join(path)}]")
    for key, value in scalars.items():
        lines.append(f"{key} = {_toml_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            _write_table(value, [*path, key], lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (inside an array)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")

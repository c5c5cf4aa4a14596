"""Find environment packages through the ``palaestra.environments`` entry-point group.

A name no entry point has is looked up as a package written for verifiers 0.1.x (an importable
module of that name that imports ``verifiers``) and run through ``palaestra.compat.verifiers``.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from palaestra.envs.base import Environment

GROUP = "palaestra.environments"


class EnvironmentNotFound(LookupError):
    """No installed environment package has that name."""


class EnvironmentArgsError(TypeError):
    """``load_environment`` was given arguments the environment does not take."""


def _normalize(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def installed_environments() -> dict[str, EntryPoint]:
    """Installed environment names (normalised: lower case, ``_`` for ``-``) and their entry points."""
    return {_normalize(ep.name): ep for ep in entry_points(group=GROUP)}


def load_environment(name: str, **kwargs: Any) -> Environment:
    """Build the environment ``name`` with ``load_environment(**kwargs)`` from its package.

    A name that is an ``http://`` or ``https://`` URL is an environment server's
    (``palaestra env serve``): a ``RemoteEnvironment`` of it, ``kwargs`` its options.
    """
    if name.startswith(("http://", "https://")):
        from palaestra.interop.remote import RemoteEnvironment

        check_arguments(name, functools.partial(RemoteEnvironment, name), kwargs)
        return RemoteEnvironment(name, **kwargs)
    found = installed_environments()
    ep = found.get(_normalize(name))
    if ep is None and _verifiers_package(name):  # a package written for verifiers 0.1.x
        from palaestra.compat.verifiers.loading import load_verifiers_environment

        return load_verifiers_environment(name, **kwargs)
    if ep is None:
        names = ", ".join(sorted(found)) or "none"
        raise EnvironmentNotFound(
            f"unknown environment {name!r}; installed: {names}. "
            f"Install one with `pip install -e environments/NAME` or from a hub with `palaestra install NAME`, "
            f"or create one with `palaestra init NAME`."
        )
    factory = ep.load()
    check_arguments(name, factory, kwargs)
    env = factory(**kwargs)
    if not isinstance(env, Environment):
        raise TypeError(f"{ep.value} returned {type(env).__name__}, not an Environment")
    return env


def check_arguments(name: str, factory: Any, kwargs: dict[str, Any]) -> None:
    """``EnvironmentArgsError`` if ``factory`` (a ``load_environment``) cannot take ``kwargs``."""
    signature = inspect.signature(factory)
    params = signature.parameters.values()
    accepted = sorted(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise EnvironmentArgsError(
                f"environment {name!r} does not take {', '.join(map(repr, unknown))}; "
                f"it takes: {', '.join(accepted) or 'no arguments'}"
            )
    try:
        signature.bind(**kwargs)
    except TypeError as exc:  # a required argument is missing
        raise EnvironmentArgsError(f"environment {name!r}: {exc}; it takes: {', '.join(accepted)}") from None


def _verifiers_package(name: str) -> bool:
    """Whether ``name`` is an installed environment package written for verifiers (no entry point)."""
    from palaestra.compat.verifiers.loading import find_package

    try:
        return find_package(name) is not None
    except ImportError as exc:  # it is one, but it does not import: say why, as one line
        raise EnvironmentNotFound(f"the verifiers environment {name!r} does not import: {exc}") from None


def eval_defaults(name: str) -> dict[str, Any]:
    """The ``[tool.palaestra.eval]`` table of an environment's ``pyproject.toml``, or ``{}``.

    It is read from the package's source folder, so it is found for editable installs and
    source checkouts (a built wheel does not ship its pyproject.toml). Keys that ``palaestra
    eval`` understands: ``num_examples``, ``rollouts_per_example``, ``env_args``.
    """
    ep = installed_environments().get(_normalize(name))
    if ep is None:
        from palaestra.compat.verifiers.loading import eval_defaults as verifiers_defaults

        return verifiers_defaults(name)  # a verifiers package's [tool.verifiers.eval], or {}
    spec = importlib.util.find_spec(ep.module.split(".")[0])
    if spec is None or spec.origin is None:
        return {}
    folder = Path(spec.origin).parent
    for candidate in (folder / "pyproject.toml", folder.parent / "pyproject.toml"):
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError):
                return {}
            entry_points = data.get("project", {}).get("entry-points", {}).get(GROUP, {})
            if _normalize(name) in {_normalize(k) for k in entry_points}:
                table = data.get("tool", {}).get("palaestra", {}).get("eval", {})
                return table if isinstance(table, dict) else {}
    return {}

"""Call user functions with arguments bound by parameter name (reward functions, scripted policies)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any


class BindingError(TypeError):
    """A user function asks for an argument palaestra cannot give it."""


class Binder:
    """Knows which names ``func`` takes, checked once, so each call is a dict lookup per name."""

    def __init__(self, func: Callable[..., Any], available: Iterable[str], *, what: str) -> None:
        self.func = func
        self.is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - async callable objects, not callability
        )
        available = set(available)
        params = inspect.signature(func).parameters.values()
        self.takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
        self.names: list[str] = []
        name = getattr(func, "__name__", repr(func))
        for p in params:
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            if p.kind is p.POSITIONAL_ONLY:
                raise BindingError(
                    f"{what} {name!r}: positional-only parameter {p.name!r} cannot be bound by name"
                )
            if p.name in available:
                self.names.append(p.name)
            elif p.default is p.empty:
                raise BindingError(
                    f"{what} {name!r} asks for argument {p.name!r}, which is not available; "
                    f"available: {', '.join(sorted(available))}"
                )

    def kwargs(self, values: dict[str, Any]) -> dict[str, Any]:
        if self.takes_all:
            return dict(values)
        return {n: values[n] for n in self.names if n in values}

    async def call(self, values: dict[str, Any]) -> Any:
        result = self.func(**self.kwargs(values))
        if self.is_async or inspect.isawaitable(result):
            result = await result
        return result

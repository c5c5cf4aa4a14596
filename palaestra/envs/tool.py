"""ToolEnv and StatefulToolEnv: the model calls Python functions until it answers without a call.

Each model reply's tool calls run concurrently (sync functions in a thread pool, never on the
event loop) and their results go back as ``tool`` messages in call order. The rollout ends when a
reply has no tool call (stop reason ``no_tool_calls``) or at ``max_turns``.

What goes wrong in a call is the model's to read, not a crash: arguments that are not JSON, an
unknown tool, missing or wrongly typed arguments, a tool that raises (anything: ``SystemExit``,
``KeyboardInterrupt`` and other ``BaseException``s too) or runs past its timeout each answer
``Error: ...`` and are counted. Only the rollout's own cancellation passes through a call.
Exceptions of a type listed in ``fatal_errors`` end the rollout instead, recorded with stage
``tool``. Every result (errors too) is cut to ``max_result_chars`` characters, the tool's own
cap or the environment's.

Metrics, per rollout: ``tool_calls`` and ``tool_errors`` over all tools, and for each tool
``<name>_calls``, ``<name>_errors`` and ``<name>_seconds`` (0 for a tool that was not called).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.envs.multiturn import EpisodeError, MultiTurnEnv, stop
from palaestra.runner import being_cancelled
from palaestra.tools import (
    DEFAULT_MAX_RESULT_CHARS,
    Tool,
    ToolArgumentError,
    as_tool,
    check_result_cap,
    cut_text,
    result_text,
)
from palaestra.types import ErrorInfo, Message, Messages, Rollout, Sampling, State


class ToolEnv(MultiTurnEnv):
    """Give the model ``tools`` (functions or ``Tool``s) for up to ``max_turns`` replies.

    ``tool_timeout`` is the default per-call timeout of functions given plainly (a ``Tool`` keeps
    its own). ``max_result_chars`` caps the characters of each tool message (None: no cap) for
    tools without a cap of their own. ``max_workers`` threads run sync tools. Other keyword
    arguments are ``MultiTurnEnv``'s; ``tools`` there means the schemas, which this class builds.
    """

    def __init__(
        self,
        *,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        max_turns: int = 10,
        tool_timeout: float | None = 30.0,
        fatal_errors: tuple[type[BaseException], ...] = (),
        max_workers: int = 16,
        max_result_chars: int | None = DEFAULT_MAX_RESULT_CHARS,
        **kwargs: Any,
    ) -> None:
        if max_result_chars is not None:
            check_result_cap(max_result_chars, "max_result_chars")
        self.max_result_chars = max_result_chars
        self.tool_timeout = tool_timeout
        self.fatal_errors = tuple(fatal_errors)
        self.tool_map: dict[str, Tool] = {}
        for t in tools:
            self.add_tool(t)
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="palaestra-tool")
        super().__init__(max_turns=max_turns, tools=self._schemas(), **kwargs)

    def add_tool(self, tool: Tool | Callable[..., Any], **options: Any) -> Tool:
        """Add a tool (a function is made one with ``Tool.from_function(tool, **options)``)."""
        options.setdefault("timeout", self.tool_timeout)
        made = as_tool(tool, **options)
        if made.name in self.tool_map:
            raise ValueError(f"two tools are named {made.name!r}")
        self.tool_map[made.name] = made
        if hasattr(self, "examples"):  # after __init__: the schemas sent to the model change too
            self.tools = self._schemas()
        return made

    def metric_names(self) -> list[str]:
        per_tool = [f"{name}_{kind}" for name in self.tool_map for kind in ("calls", "errors", "seconds")]
        return sorted({*super().metric_names(), "tool_calls", "tool_errors", *per_tool})

    def _schemas(self) -> list[dict[str, Any]] | None:
        return [t.schema for t in self.tool_map.values()] or None

    @stop
    def no_tool_calls(self, messages: Messages) -> bool:
        """The model replied without calling a tool: that reply is its answer."""
        last = messages[-1] if messages else {}
        return last.get("role") == "assistant" and not last.get("tool_calls")

    async def env_response(self, messages: Messages, state: State) -> Messages:
        """Run the last reply's tool calls concurrently; their results, in call order."""
        calls = messages[-1].get("tool_calls") or []
        results = await asyncio.gather(*(self._run_call(call, state) for call in calls))
        for outcome in results:
            if isinstance(outcome, EpisodeError):
                raise outcome
        return [m for m in results if not isinstance(m, EpisodeError)]

    def update_tool_args(self, tool: Tool, arguments: dict[str, Any], state: State) -> dict[str, Any]:
        """The arguments the function gets: the model's; ``StatefulToolEnv`` adds hidden ones."""
        return arguments

    async def _run_call(self, call: Any, state: State) -> Message | EpisodeError:
        stats = _stats(state, self.tool_map)
        function = call.get("function") if isinstance(call, dict) else None
        call_id = call.get("id", "") if isinstance(call, dict) else ""
        name = function.get("name") if isinstance(function, dict) else None
        stats["tool_calls"] += 1
        tool = self.tool_map.get(name) if isinstance(name, str) else None
        limit = (
            self.max_result_chars if tool is None or tool.max_result_chars is None else tool.max_result_chars
        )

        def reply(text: str, *, error: bool = False) -> Message:
            if error:
                stats["tool_errors"] += 1
                if name in self.tool_map:
                    stats[f"{name}_errors"] += 1
            return {"role": "tool", "tool_call_id": call_id, "content": cut_text(text, limit)}

        if tool is None or not isinstance(function, dict):
            known = ", ".join(self.tool_map) or "none"
            return reply(f"Error: unknown tool {name!r:.100}; the tools are: {known}.", error=True)
        stats[f"{tool.name}_calls"] += 1
        try:
            arguments = self.update_tool_args(tool, tool.arguments(function.get("arguments")), state)
        except ToolArgumentError as exc:
            return reply(f"Error: {exc}", error=True)
        start = time.perf_counter()
        deadline = asyncio.timeout(tool.timeout)
        try:
            async with deadline:
                value = await tool.call(arguments, executor=self._executor)
            text = result_text(value)
        except asyncio.CancelledError:
            if being_cancelled():  # the rollout is being cancelled (its timeout, the run): let it go
                raise
            return reply(f"Error: {tool.name} raised CancelledError.", error=True)
        except BaseException as exc:  # noqa: BLE001 - whatever a tool raises is its error, not the run's
            if isinstance(exc, TimeoutError) and deadline.expired():
                return reply(f"Error: {tool.name} timed out after {tool.timeout:g} s.", error=True)
            message = f"{tool.name} raised {describe_exception(exc)}"
            if isinstance(exc, self.fatal_errors):
                return EpisodeError(ErrorInfo(type(exc).__name__, cut_text(message, limit), stage="tool"))
            return reply(f"Error: {message}", error=True)
        finally:
            stats[f"{tool.name}_seconds"] += time.perf_counter() - start
        return reply(text)

    async def episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        try:
            await super().episode(client, rollout, state, sampling)
        finally:  # a failed or cut-short rollout still reports the calls it made
            rollout.metrics.update(_stats(state, self.tool_map))


class StatefulToolEnv(ToolEnv):
    """Tools that use per-rollout resources: a connection, a sandbox, a session id.

    ``setup_state`` creates the resources and puts them in ``state.resources``; ``cleanup_state``
    releases them and is always called, whatever ended the episode (an error, a timeout, a
    cancelled run). A tool parameter listed in its ``hidden`` (``Tool.from_function(f,
    hidden=["db"])``, or ``add_tool(f, hidden=["db"])``) is not shown to the model; by default it
    is filled from ``state.resources`` by name (override ``update_tool_args`` to do otherwise).
    """

    def update_tool_args(self, tool: Tool, arguments: dict[str, Any], state: State) -> dict[str, Any]:
        missing = [name for name in tool.hidden if name not in state.resources]
        if missing:
            raise RuntimeError(
                f"tool {tool.name!r} needs state.resources {missing}, which setup_state did not set"
            )
        return {**arguments, **{name: state.resources[name] for name in tool.hidden}}


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of what a tool raised, even when its ``str()`` fails; a StopIteration that
    Python turned into a RuntimeError is named as itself."""
    if isinstance(exc, RuntimeError) and isinstance(exc.__cause__, StopIteration | StopAsyncIteration):
        exc = exc.__cause__
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not turn a tool error into a crash
        text = "(its message cannot be shown)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stats(state: State, tools: dict[str, Tool]) -> dict[str, float]:
    """The rollout's tool counters, kept in ``state`` (saved with it), zero for every tool."""
    stats = state.setdefault("tool_stats", {"tool_calls": 0, "tool_errors": 0})
    for name in tools:  # also a tool added since (an MCP server's, after a reconnect)
        for key, zero in ((f"{name}_calls", 0), (f"{name}_errors", 0), (f"{name}_seconds", 0.0)):
            stats.setdefault(key, zero)
    return stats

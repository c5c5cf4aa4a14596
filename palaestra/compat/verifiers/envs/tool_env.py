"""verifiers' ``ToolEnv`` (0.1.9): the model calls Python functions until it replies without a call.

Tools are plain or ``async`` functions; their schemas (``oai_tools``) come from type hints and
docstrings (``utils.tool_utils``). Each tool call of a reply runs in order, called as verifiers
calls it: ``tool(**json.loads(arguments))``, no argument checking, a sync tool on the event loop.
The result, ``str()``-ed, is a ``tool`` message. Unparseable arguments or a tool that raises give
a tool message ``error_formatter(exc)`` instead, unless the exception's type is in ``stop_errors``:
then ``vf.ToolParseError``/``vf.ToolCallError`` ends the rollout (palaestra records it as the
rollout's error, stage ``tool``). ``no_tools_called`` stops the rollout on a reply without a call.
The rubric gets the weight-0 metrics ``total_tool_calls`` and ``<tool>_calls``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from palaestra.compat.verifiers import errors
from palaestra.compat.verifiers.decorators import stop
from palaestra.compat.verifiers.envs.multiturn_env import MultiTurnEnv
from palaestra.compat.verifiers.rubrics.rubric import Rubric
from palaestra.compat.verifiers.types import State
from palaestra.compat.verifiers.utils.async_utils import maybe_await
from palaestra.compat.verifiers.utils.tool_utils import convert_func_to_oai_tool
from palaestra.runner import being_cancelled
from palaestra.tools import DEFAULT_MAX_RESULT_CHARS, cut_text


def _name(tool: Any) -> str:
    return str(getattr(tool, "__name__", type(tool).__name__))


def _default_error_formatter(exc: Exception) -> str:
    return f"{exc}"


def _calls(completion: Any) -> list[dict[str, Any]]:
    return [
        call
        for msg in completion
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list)
        for call in msg["tool_calls"]
    ]


class ToolMonitorRubric(Rubric):
    """Counts tool calls: ``total_tool_calls`` and ``<tool>_calls``, weight 0."""

    def __init__(self, tools: list[Callable[..., Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tools = tools or []
        self.tool_names = [_name(tool) for tool in self.tools]
        self.add_metric(self.total_tool_calls)
        for name in self.tool_names:
            self.add_metric(self.get_tool_call_count_func(name))

    def add_tool_metric(self, tool: Callable[..., Any]) -> None:
        name = _name(tool)
        if name not in self.tool_names:
            self.tool_names.append(name)
            self.add_metric(self.get_tool_call_count_func(name))

    def remove_tool_metric(self, tool: Callable[..., Any]) -> None:
        name = _name(tool)
        if name in self.tool_names:
            self.tool_names.remove(name)
            for i, func in enumerate(self.funcs):
                if func.__name__ == f"{name}_calls":
                    self.funcs.pop(i)
                    self.weights.pop(i)
                    break

    async def total_tool_calls(self, completion: Any) -> float:
        """Count the total number of tool calls."""
        return float(len(_calls(completion)))

    def get_tool_call_count_func(self, tool_name: str) -> Callable[..., Any]:
        """A metric counting the calls to ``tool_name``."""

        async def tool_call_count_func(completion: Any) -> int:
            return sum(1 for call in _calls(completion) if call.get("function", {}).get("name") == tool_name)

        tool_call_count_func.__name__ = f"{tool_name}_calls"
        return tool_call_count_func


class ToolEnv(MultiTurnEnv):
    """``ToolEnv(tools=[f, g], max_turns=10, error_formatter=..., stop_errors=[...], **env_kwargs)``."""

    def __init__(
        self,
        tools: list[Callable[..., Any]] | None = None,
        max_turns: int = 10,
        error_formatter: Callable[[Exception], str] = _default_error_formatter,
        stop_errors: list[type[Exception]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.tools = tools or []
        self.max_turns = max_turns
        self.error_formatter = error_formatter
        self.stop_errors: list[type[Exception]] = stop_errors or []
        self.oai_tools = [convert_func_to_oai_tool(tool) for tool in self.tools]
        self.tool_map = {_name(tool): tool for tool in self.tools}
        super().__init__(oai_tools=self.oai_tools, max_turns=max_turns, **kwargs)
        self.tool_monitor_rubric = ToolMonitorRubric(tools=self.tools)
        self.add_rubric(self.tool_monitor_rubric)

    def _should_stop_for_error(self, err: BaseException) -> bool:
        return any(isinstance(err, kind) for kind in self.stop_errors)

    def add_tool(self, tool: Callable[..., Any]) -> None:
        self.tools.append(tool)
        if self.oai_tools is None:
            self.oai_tools = []
        self.oai_tools.append(convert_func_to_oai_tool(tool))
        self.tool_map[_name(tool)] = tool
        self.tool_monitor_rubric.add_tool_metric(tool)

    def remove_tool(self, tool: Callable[..., Any]) -> None:
        self.tools.remove(tool)
        if self.oai_tools is None:
            self.oai_tools = []
        self.oai_tools = [t for t in self.oai_tools if t["function"]["name"] != _name(tool)]
        self.tool_map.pop(_name(tool))
        self.tool_monitor_rubric.remove_tool_metric(tool)

    @stop
    async def no_tools_called(self, state: State) -> bool:
        if len(state["trajectory"]) == 0:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return bool(last["role"] == "assistant" and last.get("tool_calls") is None)

    async def call_tool(
        self, tool_name: str, tool_args: dict[str, Any], tool_call_id: str, **kwargs: Any
    ) -> dict[str, Any]:
        """Call ``tool_name`` with ``tool_args``; its result as a tool message."""
        result = await maybe_await(self.tool_map[tool_name], **tool_args)
        return {
            "role": "tool",
            "content": cut_text(str(result), DEFAULT_MAX_RESULT_CHARS),
            "tool_call_id": tool_call_id,
        }

    def _error_message(self, exc: BaseException, tool_call_id: str) -> dict[str, Any]:
        if not isinstance(exc, Exception):  # SystemExit and kin: verifiers' formatters take an Exception
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return {"role": "tool", "content": self.error_formatter(exc), "tool_call_id": tool_call_id}

    def _parse_call(self, tool_call: dict[str, Any]) -> tuple[str, str, Any]:
        function = tool_call.get("function", {})
        return tool_call.get("id", ""), function.get("name", ""), json.loads(function.get("arguments", ""))

    def _tool_args(self, name: str, args: Any, messages: list[Any], state: State, **kwargs: Any) -> Any:
        """The arguments a tool is called with: the model's (``StatefulToolEnv`` completes them)."""
        return args

    async def env_response(self, messages: list[Any], state: State, **kwargs: Any) -> list[Any]:
        """One tool message per tool call of the last reply, in order."""
        out = []
        for tool_call in messages[-1].get("tool_calls") or []:
            try:
                call_id, name, args = self._parse_call(tool_call)
            except BaseException as exc:
                _reraise_cancellation(exc)
                if self._should_stop_for_error(exc):
                    raise errors.ToolParseError from exc
                out.append(self._error_message(exc, tool_call.get("id", "")))
                continue
            args = self._tool_args(name, args, messages, state, **kwargs)
            try:
                out.append(await self.call_tool(name, args, call_id))
            except BaseException as exc:
                _reraise_cancellation(exc)
                if self._should_stop_for_error(exc):
                    raise errors.ToolCallError from exc
                out.append(self._error_message(exc, call_id))
        return out


def _reraise_cancellation(exc: BaseException) -> None:
    """Let the rollout's own cancellation go through; any other exception is the tool's."""
    if isinstance(exc, asyncio.CancelledError) and being_cancelled():
        raise exc

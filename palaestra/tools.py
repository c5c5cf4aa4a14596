"""Tools: Python functions a model can call, described by the JSON schemas the OpenAI API takes.

``Tool.from_function(func)`` reads the schema from the signature, the type hints and the
docstring (Google, NumPy or reST style: the summary becomes the tool's description, each
documented parameter its property's). The arguments a model sends are checked against that
schema (pydantic, strict: ``"3"`` is not an integer, unknown arguments are refused) before the
function runs, so a malformed call becomes an error message for the model, never a crash.

Parameters named in ``hidden`` are left out of the schema: the environment fills them (a
database connection, a session id), see ``StatefulToolEnv``.

What a call returns reaches the model as text, cut to ``max_result_chars`` characters (the
tool's own, else the environment's, ``DEFAULT_MAX_RESULT_CHARS`` by default) with a marker
saying how much was cut: a tool that returns a whole file must not fill the context window.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import typing
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import docstring_parser
import pydantic

from palaestra.openai_api import TOOL_NAME as NAME  # what the OpenAI API accepts as a function name

# About 5,000 tokens: several results fit in a 32k-token context, and every result of the bundled
# environments (20 rows of sql_quiz, a 4,000-character wiki_search section) passes whole.
DEFAULT_MAX_RESULT_CHARS = 20_000


class ToolDefinitionError(TypeError):
    """A function cannot be made into a tool (a bad name, a parameter without a usable type)."""


class ToolArgumentError(ValueError):
    """The arguments of a tool call do not fit the tool's schema; the message is for the model."""


@dataclass(frozen=True)
class Tool:
    """A callable the model can use: its name, description and parameters schema, and the function.

    ``timeout`` (seconds, None: none) bounds each call. ``hidden`` parameters are not in
    ``parameters``: the environment passes them. ``max_result_chars`` caps the text of a result
    (None: the environment's cap). Build one with ``Tool.from_function``; a tool whose arguments
    are checked elsewhere (an MCP server's) can be built directly, with ``validate`` left None.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    func: Callable[..., Any]
    timeout: float | None = 30.0
    hidden: tuple[str, ...] = ()
    validate: Callable[[str], dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    max_result_chars: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} must match {NAME.pattern} (the OpenAI API's rule)"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise ToolDefinitionError(
                f"tool {self.name!r}: timeout must be positive or None, not {self.timeout!r}"
            )
        if self.max_result_chars is not None:
            check_result_cap(
                self.max_result_chars, f"tool {self.name!r}: max_result_chars", ToolDefinitionError
            )
        if self.parameters.get("type") != "object":
            raise ToolDefinitionError(f"tool {self.name!r}: the parameters schema must be of type 'object'")

    @property
    def schema(self) -> dict[str, Any]:
        """The tool as the chat-completions ``tools`` list takes it."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}

    @classmethod
    def from_function(
        cls,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = 30.0,
        hidden: Iterable[str] = (),
        max_result_chars: int | None = None,
    ) -> Tool:
        """A tool from a plain or ``async`` function; see the module docstring."""
        name = str(name or getattr(func, "__name__", ""))
        hidden = tuple(hidden)
        doc = docstring_parser.parse(inspect.getdoc(func) or "")
        if description is None:
            description = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
        documented = {p.arg_name: p.description or "" for p in doc.params}
        try:
            hints = typing.get_type_hints(func, include_extras=True)
        except Exception as exc:  # any failure to resolve a hint is a definition error
            raise ToolDefinitionError(f"tool {name!r}: cannot read its type hints: {exc}") from exc
        fields: dict[str, Any] = {}
        params = inspect.signature(func).parameters
        unknown = set(hidden) - set(params)
        if unknown:
            raise ToolDefinitionError(f"tool {name!r}: hidden {sorted(unknown)} are not its parameters")
        for p in params.values():
            if p.name in hidden:
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise ToolDefinitionError(
                    f"tool {name!r}: parameter {p.name!r} must be a plain or keyword parameter (it is {p.kind.description})"
                )
            hint = hints.get(p.name, Any)
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hint, pydantic.Field(default, description=documented.get(p.name) or None))
        try:
            model = pydantic.create_model(
                f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
            )
            parameters = _clean(model.model_json_schema())
        except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
            raise ToolDefinitionError(f"tool {name!r}: its parameters have no JSON schema: {exc}") from exc
        parameters.setdefault("properties", {})
        parameters.setdefault("required", [])
        return cls(
            name=name,
            description=description,
            parameters=parameters,
            func=func,
            timeout=timeout,
            hidden=hidden,
            validate=functools.partial(_validate, model, name),
            max_result_chars=max_result_chars,
        )

    def arguments(self, raw: str | dict[str, Any] | None) -> dict[str, Any]:
        """The checked keyword arguments of a call; ``ToolArgumentError`` says what is wrong."""
        text = _arguments_text(raw)
        if self.validate is not None:
            return self.validate(text)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(f"the arguments are not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ToolArgumentError("the arguments must be a JSON object")
        return value

    async def call(self, arguments: dict[str, Any], *, executor: Executor | None = None) -> Any:
        """Run the function (a sync one in ``executor``'s threads, never on the event loop)."""
        if inspect.iscoroutinefunction(self.func):
            return await self.func(**arguments)
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()

        def run() -> Any:
            try:
                return context.run(self.func, **arguments)
            except StopIteration as exc:  # an asyncio future cannot hold one: the call would never end
                raise RuntimeError(f"{self.name} raised StopIteration") from exc

        result = await loop.run_in_executor(executor, run)
        if inspect.isawaitable(result):
            result = await result
        return result


def as_tool(obj: Tool | Callable[..., Any], **options: Any) -> Tool:
    """``obj`` itself if it is a ``Tool``, else ``Tool.from_function(obj, **options)``."""
    return obj if isinstance(obj, Tool) else Tool.from_function(obj, **options)


def result_text(value: Any) -> str:
    """A tool's return value as the text of a ``tool`` message: strings as they are, None as "",
    anything else as JSON (``str()`` where JSON cannot hold it)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=_plain)
    except (TypeError, ValueError):
        return str(value)


def cut_text(text: str, limit: int | None) -> str:
    """``text`` as the model gets it: whole when it has at most ``limit`` characters (or ``limit``
    is None), else its first ``limit`` characters and a line saying how many were cut."""
    if limit is None or len(text) <= limit:
        return text
    return (
        f"{text[:limit]}\n[... {len(text) - limit:,} more characters cut: the result had "
        f"{len(text):,}, the first {limit:,} are shown]"
    )


def check_result_cap(value: Any, what: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` unless ``value`` is a positive int (a cap on result characters)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{what} must be a positive integer or None, not {value!r}")


def _plain(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    return str(value)


def _arguments_text(raw: str | dict[str, Any] | None) -> str:
    if raw is None or raw == "":
        return "{}"  # no arguments: what models send for a tool without parameters
    if isinstance(raw, dict):
        return json.dumps(raw)
    if not isinstance(raw, str):
        raise ToolArgumentError(f"the arguments must be a JSON object, not {type(raw).__name__}")
    return raw


def _validate(model: type[pydantic.BaseModel], name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(f"the arguments are not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ToolArgumentError(f"the arguments must be a JSON object, not {type(value).__name__}")
    try:
        checked = model.model_validate_json(text, strict=True)
    except pydantic.ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise ToolArgumentError(f"invalid arguments for {name}: {problems}") from None
    return {key: getattr(checked, key) for key in type(checked).model_fields}


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    if error["type"] == "missing":
        return f"missing required argument {where!r}"
    if error["type"] == "extra_forbidden":
        return f"unknown argument {where!r}"
    return f"{where}: {error['msg']} (got {error.get('input')!r:.60})"


def _clean(schema: Any) -> Any:
    """A pydantic schema without its generated ``title`` keywords (property names are kept)."""
    if isinstance(schema, list):
        return [_clean(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {k: _clean(v) for k, v in value.items()}
        elif key in ("default", "enum", "const", "examples"):
            out[key] = value  # values, not schemas
        else:
            out[key] = _clean(value)
    return out

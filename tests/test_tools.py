"""Tool schemas from Python functions: what the OpenAI API accepts, and argument checks."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import jsonschema
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

import palaestra as pa
from palaestra.testing import FakeOpenAIServer


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Filter(pydantic.BaseModel):
    field: str
    values: list[int]


def weather(city: str, unit: Unit = Unit.CELSIUS, days: int = 1) -> str:
    """Get the weather forecast.

    Looks the city up first.

    Args:
        city: The city's name, e.g. "Paris".
        unit: Degrees of which scale.
        days: How many days ahead.
    """
    return f"{city}: sunny for {days} days in {unit.value}"


def search(
    query: str,
    limit: int | None = None,
    mode: Literal["any", "all"] = "any",
    tags: list[str] | None = None,
    weight: float = 1.0,
    exact: bool = False,
    where: Filter | None = None,
    note: Annotated[str, pydantic.Field(max_length=20)] = "",
) -> list[str]:
    """Search things.

    Parameters
    ----------
    query
        Words to look for.
    limit
        At most this many.
    """
    return [query]


async def no_arguments() -> str:
    """Say hello."""
    return "hello"


TOOLS = [weather, search, no_arguments]


@pytest.mark.parametrize("func", TOOLS)
def test_schemas_are_what_the_openai_sdk_and_json_schema_accept(func: Any) -> None:
    schema = pa.Tool.from_function(func).schema
    # the SDK's own request type for a function tool, checked strictly
    pydantic.TypeAdapter(ChatCompletionFunctionToolParam).validate_python(schema, strict=True)
    parameters = schema["function"]["parameters"]
    jsonschema.Draft202012Validator.check_schema(parameters)
    assert parameters["type"] == "object" and parameters["additionalProperties"] is False
    assert "title" not in parameters and all("title" not in p for p in parameters["properties"].values())


def test_descriptions_and_types_come_from_the_signature_and_docstring() -> None:
    schema = pa.Tool.from_function(weather).schema["function"]
    assert schema["name"] == "weather"
    assert schema["description"] == "Get the weather forecast.\n\nLooks the city up first."
    props = schema["parameters"]["properties"]
    assert props["city"] == {"type": "string", "description": 'The city\'s name, e.g. "Paris".'}
    assert props["days"]["type"] == "integer" and props["days"]["default"] == 1
    assert schema["parameters"]["required"] == ["city"]
    unit = schema["parameters"]["$defs"]["Unit"]
    assert unit["enum"] == ["celsius", "fahrenheit"]

    numpy_style = pa.Tool.from_function(search).schema["function"]["parameters"]
    assert numpy_style["properties"]["query"]["description"] == "Words to look for."
    assert numpy_style["properties"]["mode"]["enum"] == ["any", "all"]
    assert numpy_style["properties"]["tags"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}
    assert numpy_style["properties"]["weight"]["type"] == "number"
    assert numpy_style["properties"]["exact"]["type"] == "boolean"
    assert numpy_style["properties"]["note"]["maxLength"] == 20

    empty = pa.Tool.from_function(no_arguments).schema["function"]["parameters"]
    assert empty == {"additionalProperties": False, "properties": {}, "type": "object", "required": []}


def test_hidden_parameters_are_not_shown_and_options_are_kept() -> None:
    def lookup(key: str, db: Any) -> str:
        """Look a key up."""
        return db[key]

    tool = pa.Tool.from_function(lookup, hidden=["db"], name="get", description="Get it.", timeout=2)
    assert tool.schema["function"]["parameters"]["properties"].keys() == {"key"}
    assert (tool.name, tool.description, tool.timeout, tool.hidden) == ("get", "Get it.", 2, ("db",))


def bad_varargs(*items: str) -> None:
    """No."""


def test_functions_that_cannot_be_tools_say_why() -> None:
    with pytest.raises(pa.ToolDefinitionError, match="must be a plain or keyword parameter"):
        pa.Tool.from_function(bad_varargs)
    with pytest.raises(pa.ToolDefinitionError, match="must match"):
        pa.Tool.from_function(weather, name="get weather")
    with pytest.raises(pa.ToolDefinitionError, match=r"hidden \['nope'\] are not its parameters"):
        pa.Tool.from_function(weather, hidden=["nope"])
    with pytest.raises(pa.ToolDefinitionError, match="timeout must be positive"):
        pa.Tool.from_function(weather, timeout=0)

    def unresolvable(x: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821 - the point
        """No."""

    with pytest.raises(pa.ToolDefinitionError, match="cannot read its type hints"):
        pa.Tool.from_function(unresolvable)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"days": 2}', "missing required argument 'city'"),
        ('{"city": 3}', "city: Input should be a valid string"),
        ('{"city": "Oslo", "days": "2"}', "days: Input should be a valid integer"),
        ('{"city": "Oslo", "unit": "kelvin"}', "unit: Input should be 'celsius' or 'fahrenheit'"),
        ('{"city": "Oslo", "country": "NO"}', "unknown argument 'country'"),
        ('{"city": "Oslo"', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
    ],
)
def test_bad_arguments_get_a_message_for_the_model(raw: str, problem: str) -> None:
    tool = pa.Tool.from_function(weather)
    with pytest.raises(pa.ToolArgumentError, match=problem):
        tool.arguments(raw)


def test_good_arguments_are_typed() -> None:
    tool = pa.Tool.from_function(weather)
    assert tool.arguments('{"city": "Oslo", "unit": "fahrenheit"}') == {
        "city": "Oslo",
        "unit": Unit.FAHRENHEIT,
        "days": 1,
    }
    assert tool.arguments({"city": "Oslo"})["city"] == "Oslo"  # a dict, as scripted clients may send
    assert pa.Tool.from_function(no_arguments).arguments("") == {}
    where = pa.Tool.from_function(search).arguments('{"query": "q", "where": {"field": "f", "values": [1]}}')
    assert where["where"] == Filter(field="f", values=[1])


async def test_the_fake_server_accepts_these_schemas_and_refuses_what_openai_refuses() -> None:
    schemas = [pa.Tool.from_function(f).schema for f in TOOLS]
    messages: Any = [{"role": "user", "content": "hi"}]
    async with FakeOpenAIServer() as server:
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        async with sdk:
            reply = await sdk.chat.completions.create(model=server.model, messages=messages, tools=schemas)
            assert reply.choices[0].message.content == "hi"
            assert server.requests[0]["tools"] == schemas
            broken = [{"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}}]
            with pytest.raises(openai.BadRequestError, match="invalid schema for function 'x'"):
                await sdk.chat.completions.create(model=server.model, messages=messages, tools=broken)  # type: ignore[arg-type]

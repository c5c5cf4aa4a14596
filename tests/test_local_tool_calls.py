"""Hermes-style tool calls: the parser (``palaestra.tool_calls``), LocalClient replies and streams, and
``palaestra serve`` over a LocalClient driven by the official openai SDK.

A tiny random model does not write tool calls, so the end-to-end tests force its output: a forward
hook replaces the logits of the last position with a one-hot of the next token of a script, the
script indexed by the position id the engine passes (the prompt's length is known). Generation,
decoding, streaming and parsing are the real ones; only the model's choice is scripted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from palaestra.tool_calls import Parsed, content_span, parse

CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
WEATHER = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def call(i: int, name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


# --- the parser -----------------------------------------------------------------------------


def test_several_calls_after_text_become_openai_calls_in_order() -> None:
    text = (
        f"Let me check both.\n<tool_call>{CALL}</tool_call>\n"
        '<tool_call>{"name": "get_time", "arguments": {"zone": "CET", "n": [1, 2.5, null]}}</tool_call>'
    )
    assert parse(text) == Parsed(
        "Let me check both.",
        [
            call(0, "get_weather", '{"city": "Oslo"}'),
            call(1, "get_time", '{"zone": "CET", "n": [1, 2.5, null]}'),
        ],
        0,
    )


def test_whitespace_inside_the_tags_and_text_around_calls() -> None:
    text = f"  <tool_call>\n  {CALL}\n</tool_call>\n\nThen I answer. "
    assert parse(text) == Parsed("Then I answer.", [call(0, **WEATHER)], 0)
    assert parse(f"<tool_call>\n{CALL}\n</tool_call>\n") == Parsed(
        "", [call(0, **WEATHER)], 0
    )  # "", not None


def test_arguments_are_a_json_string_of_the_object_and_may_be_absent() -> None:
    reply = parse(
        '<tool_call>{"arguments": {"q": "é \\"x\\"", "deep": {"a": {"b": [{}]}}}, "name": "s"}</tool_call>'
    )
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {
        "q": 'é "x"',
        "deep": {"a": {"b": [{}]}},
    }
    assert "é" in reply.tool_calls[0]["function"]["arguments"]  # not escaped
    assert parse('<tool_call>{"name": "now"}</tool_call>').tool_calls == [call(0, "now", "{}")]


def test_braces_and_a_closing_tag_inside_json_strings() -> None:
    text = '<tool_call>{"name": "echo", "arguments": {"text": "}</tool_call>{"}}</tool_call> done'
    assert parse(text) == Parsed("done", [call(0, "echo", '{"text": "}</tool_call>{"}')], 0)


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>',  # unbalanced braces
        "<tool_call>get_weather(city='Oslo')</tool_call>",  # not JSON
        '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',  # empty name
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',  # name not a string
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',  # arguments a string
        '<tool_call>["f", {}]</tool_call>',  # not an object
        '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>',  # not JSON either
        '<tool_call>{"name": "f", "arguments": {}} and more</tool_call>',  # text after the object
        "<tool_call></tool_call>",
    ],
)
def test_a_malformed_call_stays_in_the_content_and_is_counted(block: str) -> None:
    text = f"Try: {block}\n<tool_call>{CALL}</tool_call>"
    assert parse(text) == Parsed(f"Try: {block}", [call(0, **WEATHER)], 1)  # the good one after is kept


def test_an_unclosed_last_call_counts_only_when_the_reply_ended_on_its_own() -> None:
    assert parse(f"Sure. <tool_call>\n{CALL}\n") == Parsed(
        "Sure.", [call(0, **WEATHER)], 0
    )  # EOS right after
    cut = f"Sure. <tool_call>\n{CALL}"
    assert parse(cut, ended=False) == Parsed(cut, [], 1)  # max_tokens: it may have gone on
    partial = f"Sure. <tool_call>{CALL[:-9]}"
    assert parse(partial) == Parsed(partial, [], 1)  # incomplete JSON is never a call


def test_an_unclosed_attempt_does_not_swallow_the_next_call() -> None:
    text = f'<tool_call>{{"name": "f"\n<tool_call>{CALL}</tool_call>'
    assert parse(text) == Parsed('<tool_call>{"name": "f"', [call(0, **WEATHER)], 1)


def test_text_without_calls_is_only_stripped() -> None:
    assert parse("  no tools needed, thanks.\n") == Parsed("no tools needed, thanks.", [], 0)
    assert parse("a <tool_cal b </tool_call> c") == Parsed("a <tool_cal b </tool_call> c", [], 0)


def test_content_span_holds_back_markup_its_prefixes_and_surrounding_whitespace() -> None:
    assert content_span("Let me") == (0, 6)
    assert content_span("\n  Let me ") == (3, 9)
    assert content_span("Let me <tool") == (0, 6)  # could become <tool_call>
    assert content_span("Let me <") == (0, 6)
    assert content_span("Let me <b>") == (0, 10)  # cannot
    assert content_span(f"Let me <tool_call>{CALL}</tool_call> and") == (0, 6)
    assert content_span("   ") == (3, 3)
    assert content_span("") == (0, 0)


@pytest.mark.parametrize(
    "final",
    [
        f"  Checking.\n<tool_call>\n{CALL}\n</tool_call>\nDone. ",
        f"<tool_call>{CALL}</tool_call>",
        "plain words < with a less-than <tool_cal and <tool_call>{bad}</tool_call> tail",
        f"\n\n<tool_call>{{</tool_call> x <tool_call>{CALL}",
        "  just text  ",
    ],
)
def test_what_a_stream_shows_is_always_a_prefix_of_the_final_content(final: str) -> None:
    for ended in (True, False):
        content = parse(final, ended=ended).content
        for n in range(len(final) + 1):
            start, end = content_span(final[:n])
            assert start <= end and content.startswith(final[start:end]), (n, final[:n])
        start, end = content_span(final)
        assert "<tool_call>" not in final[start:end]


# --- LocalClient ----------------------------------------------------------------------------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import openai  # noqa: E402

import palaestra as pa  # noqa: E402
from palaestra import chat_template  # noqa: E402
from palaestra.clients.local import LocalClient  # noqa: E402
from palaestra.serve import create_app, start  # noqa: E402

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'Call one as <tool_call>{"name": NAME, "arguments": {...}}</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}"
    '<tool_call>{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "the weather in Oslo?"}]
REPLY = f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>"


class Forcer:
    """Makes a model write ``text`` after ``prompt``: a forward hook that one-hots the next token.

    The token after position ``p`` is ``ids[p - len(prompt) + 1]`` (then EOS), so every request of
    that prompt length gets the script; the logprob of each forced token is ~0.
    """

    def __init__(self, client: LocalClient) -> None:
        self.client, self.ids, self.start = client, [], 0
        client.hf_model.register_forward_hook(self.hook, with_kwargs=True)

    def script(self, messages: list, tools: list | None, text: str, *, eos: bool = True) -> list[int]:
        tokenizer = self.client.tokenizer
        self.start = len(chat_template.prompt_ids(tokenizer, messages, tools=tools)) - 1
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] * eos
        assert tokenizer.decode(self.ids, skip_special_tokens=True) == text
        return self.ids

    def hook(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        steps = (kwargs["position_ids"][:, -1] - self.start).tolist()
        eos = self.client.tokenizer.eos_token_id
        tokens = [self.ids[s] if 0 <= s < len(self.ids) else eos for s in steps]
        forced = torch.full_like(output.logits[:, -1], -100.0)
        forced[range(len(tokens)), tokens] = 0.0
        output.logits = torch.cat([output.logits[:, :-1], forced[:, None]], dim=1)
        return output


@pytest.fixture(scope="module")
def hermes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose tokenizer knows tool-call JSON, with the Hermes template above."""
    from conftest import tiny_sentences

    from palaestra.tiny_model import TinyConfig, build_tiny_model

    path = tmp_path_factory.mktemp("tiny-hermes")
    texts = tiny_sentences() + [REPLY, json.dumps(TOOL), HERMES_TEMPLATE] * 20
    _, tokenizer = build_tiny_model(texts, TinyConfig(max_positions=1024), path=path)
    tokenizer.chat_template = HERMES_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def client(hermes_dir: Path) -> LocalClient:
    return LocalClient(hermes_dir, device="cpu", dtype="float32", name="tiny-hermes", prefix_cache_bytes=0)


@pytest.fixture
def forcer(client: LocalClient) -> Forcer:
    return Forcer(client)


def greedy(max_tokens: int = 200) -> pa.Sampling:
    return pa.Sampling(temperature=0.0, max_tokens=max_tokens)


async def test_a_reply_with_tools_carries_its_calls_and_the_exact_tokens(
    client: LocalClient, forcer: Forcer
) -> None:
    ids = forcer.script(ASK, [TOOL], REPLY)
    reply = await client.chat(ASK, tools=[TOOL], sampling=pa.Sampling(temperature=1.0, seed=3))
    assert reply.message == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [call(0, **WEATHER)],
    }
    assert reply.finish_reason == "tool_calls"
    assert reply.token_ids == ids  # the whole generated text, markup and EOS included: what training needs
    assert len(reply.logprobs) == len(ids) and all(-1e-3 < lp <= 0 for lp in reply.logprobs)
    assert client.stats.malformed_tool_calls == 0

    # the call goes back through the template the Hermes way on the next turn
    history = [*ASK, reply.message, {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"}]
    prompt = client.render(history, tools=[TOOL])
    assert f"Let me check.<tool_call>{CALL}</tool_call><|im_end|>\n<|im_start|>tool\nsunny, 21 C" in prompt


async def test_without_tools_the_text_is_never_parsed(client: LocalClient, forcer: Forcer) -> None:
    ids = forcer.script(ASK, None, REPLY)
    reply = await client.chat(ASK, sampling=greedy())
    assert (reply.message, reply.finish_reason, reply.token_ids) == (
        {"role": "assistant", "content": REPLY},
        "stop",
        ids,
    )


async def test_a_malformed_call_is_content_and_counted(client: LocalClient, forcer: Forcer) -> None:
    text = 'Hmm. <tool_call>{"name": "get_weather", "arguments": {"city": Oslo}}</tool_call>'
    forcer.script(ASK, [TOOL], text)
    reply = await client.chat(ASK, tools=[TOOL], sampling=greedy())
    assert (reply.message, reply.finish_reason) == ({"role": "assistant", "content": text}, "stop")
    assert client.stats.malformed_tool_calls == 1


async def test_a_call_cut_at_max_tokens_is_text_and_the_reply_says_length(
    client: LocalClient, forcer: Forcer
) -> None:
    ids = forcer.script(ASK, [TOOL], REPLY, eos=False)  # the model would close the tag only later
    reply = await client.chat(ASK, tools=[TOOL], sampling=greedy(len(ids) - 3))
    assert reply.finish_reason == "length" and "tool_calls" not in reply.message
    assert reply.content == client.tokenizer.decode(ids[: len(ids) - 3]).strip()
    assert client.stats.malformed_tool_calls == 1


async def test_a_stream_never_shows_markup_and_its_last_chunk_has_the_calls(
    client: LocalClient, forcer: Forcer
) -> None:
    text = f"  Let me check <b>both</b> cities.\n<tool_call>{CALL}</tool_call>\n<tool_call>\n{CALL}\n</tool_call>"
    ids = forcer.script(ASK, [TOOL], text)
    chunks = [c async for c in client.chat_stream(ASK, tools=[TOOL], sampling=greedy())]
    final = chunks[-1].response
    assert final is not None and final.finish_reason == "tool_calls"
    assert final.message["tool_calls"] == [call(0, **WEATHER), call(1, **WEATHER)]
    texts = [c.text for c in chunks]
    assert "".join(texts) == final.content == "Let me check <b>both</b> cities."
    assert not any("<tool" in t or "{" in t for t in texts)
    assert "".join(texts[:-1]) == final.content  # all of it live; the markup's chunks were empty
    assert [t for c in chunks for t in c.token_ids] == final.token_ids == ids
    assert final == await client.chat(ASK, tools=[TOOL], sampling=greedy())


async def test_tool_tags_that_are_special_tokens_survive_decoding(hermes_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(hermes_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    model = transformers.AutoModelForCausalLM.from_pretrained(hermes_dir)
    model.resize_token_embeddings(len(tokenizer))
    client = LocalClient.from_model(model, tokenizer, prefix_cache_bytes=0)
    forcer = Forcer(client)
    forcer.ids = tokenizer(REPLY, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    forcer.start = len(chat_template.prompt_ids(tokenizer, ASK, tools=[TOOL])) - 1
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in forcer.ids
    reply = await client.chat(ASK, tools=[TOOL], sampling=greedy())
    assert (reply.content, reply.message["tool_calls"]) == ("Let me check.", [call(0, **WEATHER)])
    plain = await client.chat(ASK, sampling=greedy())  # (another prompt length: the script does not apply)
    assert "<|im_end|>" not in plain.content


async def test_a_template_without_tools_refuses_them(hermes_dir: Path) -> None:
    plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    client = LocalClient(hermes_dir, device="cpu", chat_template=plain)
    assert client.tokenizer.chat_template == plain
    with pytest.raises(ValueError, match=r"chat template of .* does not take tools"):
        await client.chat(ASK, tools=[TOOL], sampling=greedy(2))


# --- palaestra serve ------------------------------------------------------------------------


async def test_serve_sends_tool_calls_to_the_openai_sdk_whole_and_streamed(
    client: LocalClient, forcer: Forcer
) -> None:
    forcer.script(ASK, [TOOL], REPLY)
    runner, url = await start(create_app(client), "127.0.0.1", 0)
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as sdk:
            args: dict[str, Any] = {
                "model": "tiny-hermes",
                "messages": ASK,
                "tools": [TOOL],
                "temperature": 0,
            }
            whole = await sdk.chat.completions.create(**args)
            stream = await sdk.chat.completions.create(**args, stream=True)
            chunks = [c async for c in stream]
    finally:
        await runner.cleanup()
    choice = whole.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Let me check.")
    [got] = choice.message.tool_calls
    assert (got.id, got.type, got.function.name, got.function.arguments) == (
        "call_0",
        "function",
        *WEATHER.values(),
    )

    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    [with_calls] = [d.tool_calls for d in deltas if d.tool_calls]
    assert [c.model_dump(exclude_none=True) for c in with_calls] == [
        {"index": 0, "id": "call_0", "type": "function", "function": WEATHER}
    ]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]

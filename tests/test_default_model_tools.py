"""The default model's tool-calling template: SmolLM2's own ChatML without tools, Hermes-style with them."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from palaestra import chat_template, tool_calls
from palaestra.clients.default_model import chat_template_for

# SmolLM2-135M-Instruct's own template, as its tokenizer (the converted GGUF) carries it
SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOL = {
    "type": "function",
    "function": {
        "name": "find_customer",
        "description": "Find a customer.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from palaestra.tiny_model import train_tokenizer

    return train_tokenizer(["hello there", json.dumps(TOOL)] * 20, vocab_size=300)


def test_only_the_default_model_gets_it() -> None:
    assert chat_template_for("smollm2") == chat_template_for("SmolLM2-135M-Instruct") is not None
    assert chat_template_for("local:other") is None and chat_template_for("gpt-4.1-mini") is None


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ],
    ],
)
def test_without_tools_it_renders_what_smollm2s_own_template_renders(
    tokenizer: object, messages: list
) -> None:
    for prompt in (True, False):
        tokenizer.chat_template = SMOLLM2_OWN  # type: ignore[attr-defined]
        own = chat_template.render(tokenizer, messages, add_generation_prompt=prompt)
        tokenizer.chat_template = chat_template_for("smollm2")  # type: ignore[attr-defined]
        assert chat_template.render(tokenizer, messages, add_generation_prompt=prompt) == own


def test_with_tools_the_schemas_calls_and_results_are_hermes_and_parse_back(tokenizer: object) -> None:
    tokenizer.chat_template = chat_template_for("smollm2")  # type: ignore[attr-defined]
    assert chat_template.takes_tools(tokenizer)
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "find_customer", "arguments": '{"name": "Ada Moss"}'},
    }
    messages = [
        {"role": "system", "content": "You work at a desk."},
        {"role": "user", "content": "I am Ada Moss."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "Customer C417: Ada Moss, city Oslo."},
    ]
    text = chat_template.render(tokenizer, messages, tools=[TOOL])
    assert text.startswith("<|im_start|>system\nYou work at a desk.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in text
    assert text.count("<|im_start|>system") == 1  # the system prompt is not repeated
    written = '<|im_start|>assistant\n<tool_call>\n{"name": "find_customer", "arguments": {"name": "Ada Moss"}}\n</tool_call><|im_end|>\n'
    assert written in text
    assert (
        "<|im_start|>user\n<tool_response>\nCustomer C417: Ada Moss, city Oslo.\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")
    # what the model is shown to write is what LocalClient reads back as the same call
    reply = written.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    parsed = tool_calls.parse(reply)
    assert parsed.malformed == 0 and parsed.content == ""
    assert [c["function"] for c in parsed.tool_calls] == [call["function"]]

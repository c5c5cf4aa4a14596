"""What a tiny model's tokenizer is trained on: message texts, tool calls and tool schemas."""

from __future__ import annotations

import json
import random
import string

import pytest

from palaestra.train.data import message_texts

SCHEMA = {"type": "function", "function": {"name": "query", "parameters": {"type": "object"}}}
CALL = {"id": "c0", "type": "function", "function": {"name": "query", "arguments": '{"sql": "SELECT 1"}'}}


def conversation(question: str = "How many?") -> list[dict]:
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c0", "content": "1"},
        {"role": "assistant", "content": "<sql>SELECT 1</sql>"},
    ]


def test_the_texts_hold_the_calls_as_the_template_writes_them_and_each_prompts_schemas() -> None:
    texts = message_texts([conversation(), conversation()], [[SCHEMA], None])
    assert texts.count("How many?") == 2
    written = (
        '<tool_call>{"name": "query", "arguments": {"sql": "SELECT 1"}}</tool_call>'  # as the tiny template
    )
    assert texts.count(written) == 2
    assert texts.count(json.dumps(SCHEMA)) == 1  # the second conversation was given no tools
    assert "" not in texts


def test_a_tokenizer_trained_on_them_writes_a_tool_call_in_far_fewer_tokens() -> None:
    pytest.importorskip("tokenizers")
    from palaestra.tiny_model import train_tokenizer

    rng = random.Random(0)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(200)]
    chats = [conversation(" ".join(rng.sample(words, 8))) for _ in range(100)]  # text to spend merges on
    call = '<tool_call>{"name": "query", "arguments": {"sql": "SELECT 1"}}</tool_call>'
    with_calls = train_tokenizer(message_texts(chats, [[SCHEMA]] * 100), vocab_size=400)
    contents = [m["content"] for chat in chats for m in chat if m["content"]]  # what it was trained on before
    without = train_tokenizer(contents, vocab_size=400)
    assert len(with_calls.tokenize(call)) * 2 < len(without.tokenize(call))

"""Tool rollouts become SFT data that is rendered with the tools the model was sampled with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.data.rollouts import save_dataset
from palaestra.tiny_model import train_tokenizer
from palaestra.train.data import DataError, load_chats, load_conversations
from palaestra.train.tokenize import IGNORE, encode

# ChatML with the tools' JSON in a system turn and calls as Hermes <tool_call> blocks
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def policy(messages: pa.Messages) -> Any:
    if messages[-1]["role"] == "user":
        call = {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        return {"content": "", "tool_calls": [call]}
    return "5"


async def tool_rollouts() -> list[pa.Rollout]:
    env = pa.ToolEnv(tools=[add], dataset=[{"question": "2 + 3?", "answer": "5"}])
    return await env.run(pa.ScriptedClient(policy))


async def test_rollouts_keep_the_tools_they_were_given_and_datasets_carry_them(tmp_path: Path) -> None:
    [rollout] = await tool_rollouts()
    assert rollout.tools == [pa.Tool.from_function(add).schema]
    assert pa.Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))).tools == rollout.tools
    plain = await pa.SingleTurnEnv(dataset=[{"question": "hi"}]).run(pa.ScriptedClient(lambda: "hello"))
    assert plain[0].tools is None
    save_dataset([rollout, plain[0]], tmp_path / "data")
    chats = load_chats(tmp_path / "data")
    assert chats[0].tools == rollout.tools and chats[1].tools is None
    assert chats[0].messages[2]["role"] == "tool" and chats[0].messages[1]["tool_calls"][0]["id"] == "c0"
    assert load_conversations(tmp_path / "data") == [c.messages for c in chats]


async def test_sft_renders_the_tools_and_trains_on_the_call_and_the_answer() -> None:
    [rollout] = await tool_rollouts()
    tokenizer = train_tokenizer(["Tools: add two integers", "tool_call 2 + 3 = 5"] * 20)
    tokenizer.chat_template = TOOLS_TEMPLATE
    end = {tokenizer.eos_token_id}
    with_tools = encode(tokenizer, rollout.messages, max_length=2048, end_of_turn=end, tools=rollout.tools)
    without = encode(tokenizer, rollout.messages, max_length=2048, end_of_turn=end)
    prompt = tokenizer.decode(with_tools.input_ids[: with_tools.prompt_length])
    assert '"name": "add"' in prompt and "Add two integers" in prompt  # as LocalClient renders it
    assert "Tools:" not in tokenizer.decode(without.input_ids)
    trained = tokenizer.decode([t for t in with_tools.labels if t != IGNORE])
    assert trained.startswith(
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
    )
    assert trained.endswith("5<|im_end|>") and "tool\n5" not in trained  # the tool's result is not trained


@pytest.mark.parametrize(
    ("tools", "message"),
    [('{"broken"', "'tools' is not valid JSON"), ('{"a": 1}', "'tools' must be a list of tool schemas")],
)
def test_bad_tools_in_sft_data_are_reported_by_row(tmp_path: Path, tools: str, message: str) -> None:
    path = tmp_path / "data.jsonl"
    row = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "tools": tools,
    }
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"row 0: {message}"):
        load_chats(path)

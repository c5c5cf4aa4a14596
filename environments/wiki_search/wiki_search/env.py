"""``load_environment``: the wiki-search ToolEnv, rewarded by an LLM judge or by exact match."""

from __future__ import annotations

from typing import Any

import palaestra as pa
from palaestra.checks import check_choice, check_int, check_text
from wiki_search.dataset import SPLITS, rows
from wiki_search.rewards import answer_format, exact_match, read_gold_section
from wiki_search.tools import read_section, search_pages, view_sections

SYSTEM_PROMPT = """\
You answer questions about the Python language from its reference manual, which you read with tools:
- search_pages(query) finds the pages that match some keywords,
- view_sections(page_id) lists a page's sections,
- read_section(section_id) shows a section's text.
Search, read the sections that hold the answer, and answer from what you read. When you know the \
answer, reply without calling a tool and put only the short answer (a name, keyword, number or \
PEP, written as in the manual) inside <answer>...</answer> tags, e.g. <answer>KeyError</answer>."""

TOOLS = (search_pages, view_sections, read_section)


class WikiSearchEnv(pa.ToolEnv):
    """A ``ToolEnv`` that also closes the judge's client, if it has one, in ``aclose``."""

    def __init__(self, *, judge_client: pa.ModelClient | None = None, **kwargs: Any) -> None:
        self.judge_client = judge_client
        super().__init__(**kwargs)

    async def aclose(self) -> None:
        await super().aclose()
        close = getattr(self.judge_client, "aclose", None)
        if close is not None:
            await close()


def make_rubric(parser: pa.Parser, judge: pa.ModelClient | None = None) -> pa.Rubric:
    """``judge`` (a ``JudgeRubric`` reward) with exact match as a metric, or exact match alone;
    ``read_gold_section`` and ``answer_format`` as metrics either way."""
    rubric: pa.Rubric
    if judge is not None:
        rubric = pa.JudgeRubric(client=judge, parser=parser)
        rubric.add(exact_match, weight=0.0)
    else:
        rubric = pa.Rubric(parser=parser)
        rubric.add(exact_match, weight=1.0)
    rubric.add(read_gold_section, weight=0.0)
    rubric.add(answer_format, weight=0.0)
    return rubric


def load_environment(
    split: str = "all",
    max_turns: int = 10,
    judge_model: str | None = None,
    judge_base_url: str = "https://api.openai.com/v1",
    judge_api_key_var: str = "OPENAI_API_KEY",
    system_prompt: str = SYSTEM_PROMPT,
) -> WikiSearchEnv:
    """The wiki-search environment over the questions of ``split`` (``train``, ``eval`` or ``all``).

    With ``judge_model``, the reward is that model's yes/no verdict (a ``JudgeRubric`` through an
    ``OpenAIClient`` at ``judge_base_url``, key from ``judge_api_key_var``; a loopback server
    needs none) and exact match is a metric; without one, the reward is exact match.
    """
    check_choice("split", split, SPLITS)
    check_int("max_turns", max_turns, minimum=1)
    check_text("system_prompt", system_prompt)
    judge = None
    if judge_model is not None:
        check_text("judge_model", judge_model)
        judge = pa.OpenAIClient(judge_model, base_url=judge_base_url, api_key_var=judge_api_key_var)
    parser = pa.XMLParser(["answer"])
    return WikiSearchEnv(
        dataset=rows(split),
        tools=list(TOOLS),
        max_turns=max_turns,
        system_prompt=system_prompt,
        parser=parser,
        rubric=make_rubric(parser, judge),
        judge_client=judge,
    )

"""Wiki search: answer questions about the Python language by searching its reference manual.

A multi-turn tool environment (the talk's recommended starting point for one's own tool-using
environment). The corpus is the Python language reference that ships with CPython
(``pydoc_data.topics``, PSF licence), split into pages and sections and indexed with SQLite FTS5;
the model gets three tools, ``search_pages``, ``view_sections`` and ``read_section``, and answers
in ``<answer>`` tags. The reward is an LLM judge's verdict when one is configured, else exact
match. ``searcher`` is a scripted policy that plays through the tools:
``palaestra eval wiki_search -m scripted:wiki_search.policies:searcher``.
"""

from wiki_search.corpus import Page, Section, pages, sections
from wiki_search.dataset import QUESTIONS, Question, rows
from wiki_search.env import SYSTEM_PROMPT, WikiSearchEnv, load_environment, make_rubric
from wiki_search.index import Index, default_index, match_expression
from wiki_search.policies import searcher
from wiki_search.rewards import answer_format, exact_match, normalize, read_gold_section
from wiki_search.tools import NotFound, read_section, search_pages, view_sections

__all__ = [
    "QUESTIONS",
    "SYSTEM_PROMPT",
    "Index",
    "NotFound",
    "Page",
    "Question",
    "Section",
    "WikiSearchEnv",
    "answer_format",
    "default_index",
    "exact_match",
    "load_environment",
    "make_rubric",
    "match_expression",
    "normalize",
    "pages",
    "read_gold_section",
    "read_section",
    "rows",
    "search_pages",
    "searcher",
    "sections",
    "view_sections",
]

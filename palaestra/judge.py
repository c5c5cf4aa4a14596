"""JudgeRubric: a rubric whose reward is an LLM judge's verdict, through any ``ModelClient``.

The judge is an ordinary ``async`` reward function registered on the rubric (metric ``name``), so
it composes with other reward functions (``add``) and with ``RubricGroup``. Its request is the
``prompt`` template filled with the question, the reference answer and the response; its reply
goes through ``verdict`` to a float. A failed judgement (the client raising, an empty reply, a
reply with no verdict) raises ``JudgeError``, which the rubric records as that rollout's scoring
error: its reward is ``None``, never a silent 0.

Judgements are cached by (template, question, answer, response): identical requests in flight
at once share one call, later ones reuse its value. Errors are not cached, so a later scoring
may succeed. The cache and the counts belong to the rubric and are shared by its copies (an
environment keeps a copy), so they span every run of environments built from it, up to
``cache_size`` values (least recently used dropped first); ``clear_cache`` starts afresh.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import re
import string
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from palaestra.binding import Binder
from palaestra.clients.base import ModelClient
from palaestra.parsers import Parser
from palaestra.rubric import Rubric
from palaestra.types import Messages, Sampling, content_text

DEFAULT_PROMPT = """You are grading a response to a question, given the reference answer.

Question:
{question}

Reference answer:
{answer}

Response:
{response}

Does the response give the same answer as the reference? Reply with one word: yes or no."""
FIELDS = ("question", "answer", "response")
JUDGE_ARGS = ("prompt", "completion", "answer", "parser")
Key = tuple[str, str, str, str]


class JudgeError(Exception):
    """A judgement failed: the judge's request raised, or its reply has no verdict."""


def yes_no(reply: str) -> float:
    """The default verdict: 1.0 if the reply's first word is "yes", 0.0 if "no" (any case or
    punctuation around it; a leading ``<think>`` block is skipped); else a ``JudgeError``."""
    match = re.match(r"[^A-Za-z0-9]*([A-Za-z]+)", reply.rsplit("</think>", 1)[-1])
    word = match[1].lower() if match else ""
    if word not in ("yes", "no"):
        raise JudgeError(f"no yes/no verdict in the reply {reply!r:.200}")
    return 1.0 if word == "yes" else 0.0


def last_user_text(prompt: Messages) -> str:
    """The default question: the text of the prompt's last user message ("" if none)."""
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return content_text(users[-1].get("content")) if users else ""


def _signature(question: Callable[..., Any]) -> inspect.Signature:
    """What the judge reward function takes: the arguments it needs and those ``question`` asks for."""
    own = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in JUDGE_ARGS]
    for p in inspect.signature(question).parameters.values():
        if p.name not in JUDGE_ARGS and p.kind is not p.VAR_POSITIONAL:
            own.append(p if p.kind is p.VAR_KEYWORD else p.replace(kind=p.KEYWORD_ONLY))
    return inspect.Signature(sorted(own, key=lambda p: p.kind))


class _Cache:
    """Judged values, calls in flight and counts: one per ``JudgeRubric``, shared by its copies."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: OrderedDict[Key, float] = OrderedDict()
        self.pending: dict[Key, asyncio.Task[float]] = {}
        self.slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()  # a semaphore works on one event loop only
        )
        self.calls = 0
        self.judgements = 0


class JudgeRubric(Rubric):
    """A rubric with one reward function, ``name``, scored by the judge model ``client``.

    ``prompt`` is the judge's user message, a template using ``{question}``, ``{answer}`` and
    ``{response}`` (which it must use). ``verdict`` turns the judge's reply into a float (raise
    for a reply without one). The response judged is ``parser.parse_answer(completion)``, or the
    last assistant reply's text when the parser finds no answer. ``question`` gives the question,
    its arguments bound by name like a reward function's (``lambda question: question`` reads a
    dataset column); by default, the last user message of the prompt. At most
    ``max_concurrent`` judge requests are in flight; a group's judgements run at once (the
    rubric awaits an async reward function for the whole group together).
    """

    def __init__(
        self,
        *,
        client: ModelClient,
        prompt: str = DEFAULT_PROMPT,
        verdict: Callable[[str], float] = yes_no,
        sampling: Sampling | None = None,
        weight: float = 1.0,
        name: str = "judge",
        max_concurrent: int = 32,
        parser: Parser | None = None,
        question: Callable[..., Any] = last_user_text,
        cache_size: int = 10_000,
    ) -> None:
        fields = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
        if not fields <= set(FIELDS) or "response" not in fields:
            raise ValueError(
                f"the judge prompt must use {{response}} and only {FIELDS} (write a literal brace as "
                f"{{{{ or }}}}), got {sorted(fields)}"
            )
        if max_concurrent < 1 or cache_size < 0:
            raise ValueError(
                f"need max_concurrent >= 1 and cache_size >= 0, got {max_concurrent}, {cache_size}"
            )
        super().__init__(parser=parser)
        self.client = client
        self.prompt = prompt
        self.verdict = verdict
        self.sampling = sampling or Sampling(temperature=0.0, max_tokens=16)
        self.max_concurrent = max_concurrent
        self._question = Binder(question, inspect.signature(question).parameters, what="judge question")
        self._cache = _Cache(cache_size)
        self._func = self._reward_function(name, question)
        self.add(self._func, weight)

    @property
    def judge_calls(self) -> int:
        """Judge calls made (failed ones included; a client's own retries are one call)."""
        return self._cache.calls

    @property
    def cache_hits(self) -> int:
        """Judgements answered by another one's call: a cached value or a call already in flight."""
        return max(self._cache.judgements - self._cache.calls, 0)

    def clear_cache(self) -> None:
        """Forget every judged value (calls in flight still finish for those waiting on them)."""
        self._cache.values.clear()

    def _reward_function(self, name: str, question: Callable[..., Any]) -> Callable[..., Any]:
        """The reward function: it takes what the judge needs plus what ``question`` asks for."""

        async def judge(**values: Any) -> float:
            self._cache.judgements += 1
            value = self._start(self._key(values))
            return value if isinstance(value, float) else await asyncio.shield(value)

        judge.__signature__ = _signature(question)  # type: ignore[attr-defined]
        judge.__name__ = judge.__qualname__ = name
        return judge

    def _key(self, values: dict[str, Any]) -> Key:
        """(template, question, answer, response) of one rollout, from its reward-function values."""
        completion, parser, answer = values["completion"], values["parser"], values["answer"]
        response = parser.parse_answer(completion)
        if response is None or response == "":
            texts = Parser.assistant_texts(completion)
            response = texts[-1] if texts else ""
        question = self._question.func(**self._question.kwargs(values))
        return (self.prompt, str(question), "" if answer is None else str(answer), str(response))

    def _start(self, key: Key) -> float | asyncio.Task[float]:
        """The cached value, or the call in flight for ``key`` (started here if there is none)."""
        cache = self._cache
        if key in cache.values:
            cache.values.move_to_end(key)
            return cache.values[key]
        task = cache.pending.get(key)
        loop = asyncio.get_running_loop()
        if task is None or task.get_loop() is not loop:
            cache.calls += 1
            task = cache.pending[key] = loop.create_task(self._call(key))
            task.add_done_callback(lambda done: self._settle(key, done))
        return task

    def _settle(self, key: Key, task: asyncio.Task[float]) -> None:
        cache = self._cache
        if cache.pending.get(key) is task:
            del cache.pending[key]
        if task.cancelled() or task.exception() is not None or not cache.size:
            return  # errors are not cached (and reading exception() marks them retrieved)
        cache.values[key] = task.result()
        while len(cache.values) > cache.size:
            cache.values.popitem(last=False)

    async def _call(self, key: Key) -> float:
        """Ask the judge once; ``JudgeError`` naming the judge model for any failure."""
        model = getattr(self.client, "model", "?")
        text = self.prompt.format(**dict(zip(FIELDS, key[1:], strict=True)))
        slots = self._cache.slots.setdefault(
            asyncio.get_running_loop(), asyncio.Semaphore(self.max_concurrent)
        )
        async with slots:
            try:
                response = await self.client.chat([{"role": "user", "content": text}], sampling=self.sampling)
            except Exception as exc:
                raise JudgeError(f"judge {model!r} request failed: {type(exc).__name__}: {exc}") from exc
        reply = content_text(response.message.get("content"))
        if not reply.strip():
            raise JudgeError(f"judge {model!r} gave an empty reply (finish reason {response.finish_reason})")
        try:
            value = self.verdict(reply)
        except Exception as exc:
            detail = (
                str(exc)
                if isinstance(exc, JudgeError)
                else f"{type(exc).__name__}: {exc} (reply {reply!r:.200})"
            )
            raise JudgeError(f"judge {model!r}: {detail}") from exc
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise JudgeError(f"judge {model!r}: verdict gave {value!r:.50} for the reply {reply!r:.200}")
        return float(value)

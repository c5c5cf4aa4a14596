"""Environment: a dataset of examples, a prompt format, a parser and a rubric, plus ``run``.

Subclasses implement ``rollout`` (``MultiTurnEnv`` does, for every turn-based environment).
``run``/``stream`` hand the rollouts to the engine, so eval, data generation and training all
share one rollout path.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.parsers import Parser
from palaestra.rubric import Rubric
from palaestra.types import Example, Messages, Rollout, Sampling

OnRollout = Callable[[Rollout], Awaitable[None] | None]


class DatasetError(ValueError):
    """A dataset row cannot be turned into an example."""


class Environment:
    """Holds the examples and how to judge them.

    ``dataset`` is a list of dicts or a ``datasets.Dataset``. Each row has either ``prompt`` (a
    message list, or a string taken as the user message) or ``question`` (the user message);
    ``answer`` and ``info`` are optional; every column is available to reward functions by name.
    ``system_prompt`` and ``few_shot`` messages go before a ``question``, and before a ``prompt``
    that does not start with a system message; a prompt's own leading system messages are kept
    first, followed by the few-shot messages (``system_prompt`` is then not used).
    """

    def __init__(
        self,
        *,
        dataset: Iterable[Mapping[str, Any]] = (),
        system_prompt: str | None = None,
        few_shot: Messages | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling: Sampling | None = None,
        tools: list[dict[str, Any]] | None = None,
        pass_threshold: float = 0.5,
    ) -> None:
        self.system_prompt = system_prompt
        self.pass_threshold = pass_threshold  # a rollout "passes" (pass@k) at this reward or above
        self.few_shot = list(few_shot or [])
        self.parser = parser or (rubric.parser if rubric else Parser())
        # a copy: binding to this dataset and parser must not change a rubric shared by two envs
        self.rubric = copy.copy(rubric) if rubric else Rubric(parser=self.parser)
        if not self.rubric.parser_given:  # reward functions asking for `parser` get the env's
            self.rubric.parser = self.parser
        self.sampling = sampling or Sampling()
        self.tools = tools
        self.examples = [self.make_example(i, dict(row)) for i, row in enumerate(dataset)]
        columns = set().union(*(e.row.keys() for e in self.examples[:1]))
        self.rubric.bind(sorted(columns))

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        """Turn dataset row ``index`` into an ``Example`` (override to build prompts differently)."""
        head: Messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        head += self.few_shot
        if "prompt" in row:
            prompt = row["prompt"]
            if isinstance(prompt, str):
                messages = [*head, {"role": "user", "content": prompt}]
            elif isinstance(prompt, list) and all(isinstance(m, Mapping) and "role" in m for m in prompt):
                own = [dict(m) for m in prompt]
                n_system = next((i for i, m in enumerate(own) if m["role"] != "system"), len(own))
                # the prompt's own system messages stay first; few-shot turns follow them
                messages = [*own[:n_system], *self.few_shot, *own[n_system:]] if n_system else [*head, *own]
            else:
                raise DatasetError(f"row {index}: 'prompt' must be a string or a list of chat messages")
        elif "question" in row:
            messages = [*head, {"role": "user", "content": str(row["question"])}]
        else:
            raise DatasetError(
                f"row {index} has neither a 'prompt' nor a 'question' column (columns: {', '.join(row)})"
            )
        info = row.get("info") or {}
        if not isinstance(info, dict):
            raise DatasetError(f"row {index}: 'info' must be a dict, not {type(info).__name__}")
        return Example(id=index, prompt=messages, answer=row.get("answer"), info=info, row=row)

    async def rollout(
        self,
        client: ModelClient,
        example: Example,
        *,
        rollout_index: int = 0,
        seed: int = 0,
        sampling: Sampling | None = None,
        limiter: asyncio.Semaphore | None = None,
    ) -> Rollout:
        """Play one episode of ``example``; failures are recorded on the rollout, not raised."""
        raise NotImplementedError

    def select(self, n: int = -1) -> list[Example]:
        """The first ``n`` examples (all when ``n`` is negative)."""
        if n == 0 or not self.examples:
            raise DatasetError("no examples to run: the dataset is empty or n is 0")
        return self.examples if n < 0 else self.examples[:n]

    def stream(
        self,
        client: ModelClient,
        *,
        n: int = -1,
        rollouts_per_example: int = 1,
        max_concurrent: int = 32,
        seed: int = 0,
        sampling: Sampling | None = None,
    ) -> AsyncIterator[Rollout]:
        """Scored rollouts as their groups finish (completion order, not example order)."""
        from palaestra.engine import stream_rollouts

        return stream_rollouts(
            self,
            client,
            self.select(n),
            rollouts_per_example=rollouts_per_example,
            max_concurrent=max_concurrent,
            seed=seed,
            sampling=sampling or self.sampling,
        )

    async def run(
        self,
        client: ModelClient,
        *,
        n: int = -1,
        rollouts_per_example: int = 1,
        max_concurrent: int = 32,
        seed: int = 0,
        sampling: Sampling | None = None,
        on_rollout: OnRollout | None = None,
    ) -> list[Rollout]:
        """Run and score ``n × rollouts_per_example`` rollouts; returned in (example, index) order.

        ``on_rollout`` is called with each scored rollout as soon as its group is done, so a
        caller can save results incrementally.
        """
        results: list[Rollout] = []
        stream = self.stream(
            client,
            n=n,
            rollouts_per_example=rollouts_per_example,
            max_concurrent=max_concurrent,
            seed=seed,
            sampling=sampling,
        )
        async with contextlib.aclosing(stream):  # a failing callback still cancels the rest
            async for rollout in stream:
                results.append(rollout)
                if on_rollout is not None:
                    out = on_rollout(rollout)
                    if out is not None:
                        await out
        return sorted(results, key=lambda r: (r.example_id, r.rollout_index))

"""Environment: a dataset of examples, a prompt format, a parser and a rubric, plus ``run``.

``rollout`` plays one episode: it builds the ``Rollout`` record and its ``State``, runs the
subclass's ``episode`` under the rollout timeout and records any failure. ``MultiTurnEnv``
implements ``episode`` for every turn-based environment. ``run``/``stream`` hand the rollouts to
the engine, so eval, data generation and training all share one rollout path.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from palaestra.clients.base import ModelClient, ModelError
from palaestra.clients.limited import rollout_deadline
from palaestra.parsers import Parser
from palaestra.rubric import Rubric
from palaestra.runner import being_cancelled
from palaestra.types import ErrorInfo, Example, Messages, Rollout, RunSpec, Sampling, State, derive_seed

OnRollout = Callable[[Rollout], Awaitable[None] | None]


class DatasetError(ValueError):
    """A dataset row cannot be turned into an example."""


class RolloutTimeout(Exception):
    """The rollout ran past the environment's ``timeout`` (time waiting for a request slot excluded)."""


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
        timeout: float | None = None,
    ) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout = timeout  # seconds a rollout may take, waiting for a request slot excluded
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
    ) -> Rollout:
        """Play one episode of ``example``; failures are recorded on the rollout, never raised.

        The rollout's ``rng`` and seed come from (``seed``, example id, ``rollout_index``). The
        episode runs under ``timeout``, except time the engine's client spends waiting for a free
        request slot. Subclasses implement ``episode``, not this.
        """
        rollout_seed = derive_seed(seed, example.id, rollout_index)
        state = State(example, random.Random(rollout_seed))
        rollout = Rollout(
            example_id=example.id,
            rollout_index=rollout_index,
            seed=rollout_seed,
            prompt=[dict(m) for m in example.prompt],
            answer=example.answer,
            info=dict(example.info),
            state=state,
        )
        start = time.perf_counter()
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                with rollout_deadline(deadline):
                    await self.episode(client, rollout, state, sampling or self.sampling)
        except TimeoutError as exc:
            if not deadline.expired():  # a TimeoutError of the episode's own
                _record(rollout, exc, "env")
            else:
                timeout = RolloutTimeout(f"rollout exceeded {self.timeout:g}s")
                rollout.error = ErrorInfo.from_exception(timeout, stage="timeout")
                rollout.stop_reason = "timeout"
        except asyncio.CancelledError as exc:
            if being_cancelled():  # the run or the engine cancelled this rollout: let it go
                raise
            _record(rollout, exc, "env")
        except BaseException as exc:  # noqa: BLE001 - an episode's failure (SystemExit too) is recorded, never raised
            _record(rollout, exc, "model" if isinstance(exc, ModelError) else "env")
        rollout.timing.total = time.perf_counter() - start
        return rollout

    async def episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        """Play the episode: talk to ``client`` and append to ``rollout.completion`` and ``.turns``.

        ``client`` is already limited by the engine (no semaphore needed here). An exception ends
        the rollout with that error recorded (stage ``model`` for a ``ModelError``, else ``env``).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement episode (or use MultiTurnEnv)")

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tool schemas the model is given (what a chat template renders), or ``None``."""
        return self.tools

    def metric_names(self) -> list[str]:
        """The metrics a scored rollout of this environment carries (an ``EnvGroup`` fills the others')."""
        return list(self.rubric.names)

    def metric_info(self) -> dict[str, dict[str, Any]]:
        """Each metric's weight in the reward and direction (``higher_is_better``), by name."""
        describe = getattr(self.rubric, "describe", None)
        if callable(describe):
            return dict(describe())
        # a rubric of another shape (verifiers' own, through palaestra.compat): its functions and weights
        funcs, weights = getattr(self.rubric, "funcs", []), getattr(self.rubric, "weights", [])
        return {
            getattr(f, "__name__", str(f)): {"weight": float(w), "higher_is_better": True}
            for f, w in zip(funcs, weights, strict=False)
        }

    def run_notes(self) -> dict[str, str]:
        """What a run of this environment must state beside its results (a weaker sandbox, say):
        saved in the run's metadata and shown with its summary. None by default."""
        return {}

    def env_pass_thresholds(self) -> dict[str, float] | None:
        """For a mixture of environments (``EnvGroup``): each one's ``pass_threshold``; ``None`` otherwise."""
        return None

    def env_metric_names(self) -> dict[str, list[str]] | None:
        """For a mixture of environments (``EnvGroup``): each one's own metrics; ``None`` otherwise."""
        return None

    async def aclose(self) -> None:
        """Release what the environment holds across rollouts (an MCP server, a pool); a no-op here.

        The CLI and the trainers call it when they are done; a script may use ``async with env:``.
        The environment stays usable: a later rollout acquires what it needs again.
        """

    async def __aenter__(self) -> Environment:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def select(self, n: int = -1) -> list[Example]:
        """The first ``n`` examples (all when ``n`` is negative); ``DatasetError`` if there are fewer."""
        if n == 0 or not self.examples:
            raise DatasetError("no examples to run: the dataset is empty or n is 0")
        if n > len(self.examples):
            raise DatasetError(
                f"asked for {n} examples but the dataset has {len(self.examples)} (-1 runs them all)"
            )
        return self.examples if n < 0 else self.examples[:n]

    def stream(self, client: ModelClient, spec: RunSpec | None = None) -> AsyncGenerator[Rollout, None]:
        """Scored rollouts as their groups finish (completion order, not example order)."""
        from palaestra.engine import stream_rollouts

        spec = spec or RunSpec()
        return stream_rollouts(self, client, self.select(spec.num_examples), spec)

    async def run(
        self, client: ModelClient, spec: RunSpec | None = None, *, on_rollout: OnRollout | None = None
    ) -> list[Rollout]:
        """Run and score the rollouts ``spec`` asks for; returned in (example, index) order.

        ``on_rollout`` is called with each scored rollout as soon as its group is done, so a
        caller can save results incrementally.
        """
        results: list[Rollout] = []
        stream = self.stream(client, spec)
        async with contextlib.aclosing(stream):  # a failing callback still cancels the rest
            async for rollout in stream:
                results.append(rollout)
                if on_rollout is not None:
                    out = on_rollout(rollout)
                    if out is not None:
                        await out
        return sorted(results, key=lambda r: (r.example_id, r.rollout_index))


def _record(rollout: Rollout, exc: BaseException, stage: str) -> None:
    """Record ``exc`` as the rollout's error unless the episode already recorded one."""
    if rollout.error is None:
        rollout.error = ErrorInfo.from_exception(exc, stage=stage)
        rollout.stop_reason = "error"

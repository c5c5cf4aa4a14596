"""Rubric: a weighted list of reward functions that scores a group of rollouts.

A reward function is a plain or ``async`` function whose parameters are bound by name from:
``prompt``, ``completion``, ``messages``, ``answer``, ``state``, ``info``, ``example``, ``parser``,
``rollout``, ``example_id``, ``rollout_index``, and any dataset column. It returns a float.

A group function, marked with ``@group_reward``, sees the whole group of rollouts of one example
at once: each argument is then a list (one entry per rollout) and it returns a list of floats.

Functions run one after the other; an ``async`` one is awaited for all rollouts of the group at
once. Weight 0 makes a function a metric: recorded, not part of the reward. Each function says which
way is better (``higher_is_better``, default True; False for turns used, errors, ...): the report
colours its deltas by it. A function that raises is
recorded as that rollout's error (stage ``scoring``) and its reward is ``None`` — never scored 0.
A rollout that failed before scoring (model, environment, timeout) is not scored at all.
"""

from __future__ import annotations

import asyncio
import numbers
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from palaestra.binding import Binder
from palaestra.parsers import Parser
from palaestra.runner import captured
from palaestra.types import ErrorInfo, Example, Rollout

STANDARD_ARGS = (
    "prompt",
    "completion",
    "messages",
    "answer",
    "state",
    "info",
    "example",
    "parser",
    "rollout",
    "example_id",
    "rollout_index",
)

F = TypeVar("F", bound=Callable[..., Any])


def group_reward(func: F) -> F:
    """Mark ``func`` as a group-level reward: it gets lists and returns one float per rollout."""
    func.__palaestra_group__ = True  # type: ignore[attr-defined]  # a marker read by Rubric
    return func


def is_group_reward(func: Callable[..., Any]) -> bool:
    return bool(getattr(func, "__palaestra_group__", False))


class RewardError(Exception):
    """A reward function raised or returned something that is not a number."""


class Rubric:
    """Weighted reward functions. ``weights`` defaults to 1.0 each, ``higher_is_better`` to True each.

    Unknown argument names are rejected when an environment binds the rubric to its dataset
    (``bind``), which is when the dataset's columns are known.
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]] = (),
        weights: Sequence[float] | None = None,
        *,
        parser: Parser | None = None,
        higher_is_better: Sequence[bool] | None = None,
    ) -> None:
        if weights is not None and len(weights) != len(funcs):
            raise ValueError(f"{len(funcs)} reward functions but {len(weights)} weights")
        if higher_is_better is not None and len(higher_is_better) != len(funcs):
            raise ValueError(
                f"{len(funcs)} reward functions but {len(higher_is_better)} higher_is_better flags"
            )
        self.funcs: list[Callable[..., Any]] = []
        self.weights: list[float] = []
        self.higher_is_better: list[bool] = []
        self.parser = parser or Parser()
        self.parser_given = parser is not None  # if not, an environment hands it its own parser
        self._parsers: list[Parser | None] = []  # per function; None means the rubric's parser
        self._binders: list[Binder] | None = None
        for i, func in enumerate(funcs):
            better = True if higher_is_better is None else bool(higher_is_better[i])
            self.add(func, 1.0 if weights is None else weights[i], higher_is_better=better)

    def add(
        self,
        func: Callable[..., Any],
        weight: float = 1.0,
        *,
        parser: Parser | None = None,
        higher_is_better: bool = True,
    ) -> None:
        """Append a reward function; ``parser`` (default: the rubric's) is what it gets as ``parser``.

        ``higher_is_better=False`` marks a metric where less is better (turns used, errors)."""
        name = getattr(func, "__name__", None)
        if not callable(func) or not name:
            raise TypeError(f"reward functions must be named callables, got {func!r}")
        if name in self.names:
            raise ValueError(f"two reward functions are named {name!r}; metrics are keyed by name")
        self.funcs.append(func)
        self.weights.append(float(weight))
        self.higher_is_better.append(bool(higher_is_better))
        self._parsers.append(parser)
        self._binders = None

    @property
    def names(self) -> list[str]:
        return [f.__name__ for f in self.funcs]

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each function's weight and direction, by name: what a saved run keeps for its report."""
        better = [*self.higher_is_better, *[True] * (len(self.funcs) - len(self.higher_is_better))]
        return {  # funcs and weights edited in place (as a subclass may) keep the default direction
            getattr(f, "__name__", str(f)): {"weight": float(w), "higher_is_better": b}
            for f, w, b in zip(self.funcs, self.weights, better, strict=False)
        }

    def bind(self, columns: Sequence[str] = ()) -> None:
        """Check every function's arguments against what will be available; raise if one is unknown."""
        available = set(STANDARD_ARGS) | set(columns)
        self._binders = [Binder(f, available, what="reward function") for f in self.funcs]

    async def score_group(self, rollouts: Sequence[Rollout], examples: Sequence[Example]) -> None:
        """Set ``reward`` and ``metrics`` on each rollout of one group, in place.

        A rollout that already failed (a model, environment or timeout error) is not scored: its
        reward stays ``None`` and group functions see only the others.
        """
        if self._binders is None:
            self.bind(list(examples[0].row) if examples else [])
        assert self._binders is not None
        ok = [i for i, r in enumerate(rollouts) if r.error is None]
        if len(ok) < len(rollouts):
            for rollout in rollouts:
                if rollout.error is not None:
                    rollout.reward = None
            rollouts, examples = [rollouts[i] for i in ok], [examples[i] for i in ok]
            if not rollouts:
                return
        start = time.perf_counter()
        values = [self._values(r, e) for r, e in zip(rollouts, examples, strict=True)]
        failed: dict[int, ErrorInfo] = {}
        for func, binder, parser in zip(self.funcs, self._binders, self._parsers, strict=True):
            name = func.__name__
            for v in values:
                v["parser"] = parser or self.parser
            if is_group_reward(func):
                await self._score_group_func(name, binder, rollouts, values, failed)
                continue
            # the group's rollouts at once: an async function (a judge, a sandbox) waits in parallel
            results = await asyncio.gather(*(captured(binder.call(v)) for v in values))
            for i, (rollout, result) in enumerate(zip(rollouts, results, strict=True)):
                try:
                    if isinstance(result, BaseException):
                        raise result
                    rollout.metrics[name] = _as_float(name, result)
                except BaseException as exc:  # noqa: BLE001 - any user error becomes a recorded error
                    failed.setdefault(i, _reward_error(name, exc))
        elapsed = (time.perf_counter() - start) / max(len(rollouts), 1)
        for i, rollout in enumerate(rollouts):
            rollout.timing.scoring += elapsed
            if i in failed:
                rollout.reward = None
                if rollout.error is None:
                    rollout.error = failed[i]
            else:
                rollout.reward = sum(
                    w * rollout.metrics[f.__name__] for f, w in zip(self.funcs, self.weights, strict=True)
                )

    async def _score_group_func(
        self,
        name: str,
        binder: Binder,
        rollouts: Sequence[Rollout],
        values: list[dict[str, Any]],
        failed: dict[int, ErrorInfo],
    ) -> None:
        columns = {key: [v[key] for v in values] for key in values[0]} if values else {}
        try:
            scores = await captured(binder.call(columns))
            if isinstance(scores, BaseException):
                raise scores
            if not isinstance(scores, Sequence) or len(scores) != len(rollouts):
                raise RewardError(
                    f"group reward {name!r} must return {len(rollouts)} floats, got {scores!r:.100}"
                )
            for rollout, score in zip(rollouts, scores, strict=True):
                rollout.metrics[name] = _as_float(name, score)
        except BaseException as exc:  # noqa: BLE001 - any user error becomes a recorded error
            for i in range(len(rollouts)):
                failed.setdefault(i, _reward_error(name, exc))

    def _values(self, rollout: Rollout, example: Example) -> dict[str, Any]:
        return {
            **example.row,
            "prompt": rollout.prompt,
            "completion": rollout.completion,
            "messages": rollout.messages,
            "answer": rollout.answer,
            "state": rollout.state,
            "info": rollout.info,
            "example": example,
            "parser": self.parser,
            "rollout": rollout,
            "example_id": rollout.example_id,
            "rollout_index": rollout.rollout_index,
        }


class RubricGroup(Rubric):
    """Several rubrics scored as one: the reward is the sum of their weighted rewards.

    Each function keeps its own rubric's parser; functions of a rubric built without a parser get
    the group's, which an environment replaces with its own.
    """

    def __init__(self, rubrics: Sequence[Rubric]) -> None:
        super().__init__()
        self.rubrics = list(rubrics)
        for rubric in rubrics:
            own = rubric.parser if rubric.parser_given else None
            for func, weight, parser, better in zip(
                rubric.funcs, rubric.weights, rubric._parsers, rubric.higher_is_better, strict=True
            ):
                self.add(func, weight, parser=parser or own, higher_is_better=better)


def _as_float(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real):
        raise RewardError(f"reward function {name!r} returned {value!r:.100}, not a number")
    return float(value)


def _reward_error(name: str, exc: BaseException) -> ErrorInfo:
    return ErrorInfo(type=type(exc).__name__, message=f"in {name}: {exc}", stage="scoring")

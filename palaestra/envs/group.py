"""EnvGroup: a mixture of environments that behaves as one ``Environment``.

Each row is tagged with the environment it comes from (``Example.env``, saved as ``Rollout.env``)
and each rollout is run and scored by that environment, with the seed it would get if that
environment ran alone, so a group's per-environment results equal separate runs'. Every scored
rollout carries every environment's metric names (0.0 for another environment's), so saved rows
all have the same columns; per-environment summaries (``summarize(..., env_metrics=)``) show each
environment's own metrics only.

Rows are interleaved, not concatenated, so any prefix is a mix (``-n 30`` of a group, or a
training batch of consecutive examples). Without ``weights`` each row appears once, taken round
robin (an environment whose rows run out drops out of the turn). With ``weights`` the mix follows
them: smaller datasets are cycled until each environment's share of the rows is its weight and
every row has appeared at least once (for training batches; for an evaluation, leave weights out).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.envs.base import Environment
from palaestra.rubric import Rubric
from palaestra.types import Example, Rollout, Sampling


def schedule(sizes: Mapping[str, int], weights: Mapping[str, float] | None = None) -> list[tuple[str, int]]:
    """The group's rows as (environment, row index).

    Without weights: round robin, each row once (an environment that runs out drops out). With
    weights: smooth weighted round robin over each environment's rows, cycled, long enough that
    every row appears and each environment's share of the rows is its weight.
    """
    names = list(sizes)
    if weights is None:
        return [(n, i) for i in range(max(sizes.values())) for n in names if i < sizes[n]]
    rounds = max(math.ceil(sizes[n] / weights[n] - 1e-9) for n in names)  # whole weights: exact shares
    quotas = {n: max(sizes[n], round(weights[n] * rounds)) for n in names}
    credit = dict.fromkeys(names, 0)
    taken = dict.fromkeys(names, 0)
    whole = sum(quotas.values())
    out = []
    for _ in range(whole):
        for n in names:
            credit[n] += quotas[n]
        pick = max(names, key=lambda n: credit[n])  # ties: the first listed
        credit[pick] -= whole
        out.append((pick, taken[pick] % sizes[pick]))
        taken[pick] += 1
    return out


class EnvGroupRubric(Rubric):
    """Scores a group of rollouts with the rubric of the environment they came from."""

    def __init__(self, group: EnvGroup) -> None:
        super().__init__()
        self.group = group

    @property
    def names(self) -> list[str]:
        return self.group.metric_names()

    def bind(self, columns: Sequence[str] = ()) -> None:
        """Each environment's rubric was bound to its own dataset when it was built."""

    async def score_group(self, rollouts: Sequence[Rollout], examples: Sequence[Example]) -> None:
        if not rollouts:
            return
        name = examples[0].env
        assert name is not None and all(e.env == name for e in examples), "a group of one environment's rows"
        env = self.group.envs[name]
        inner = [self.group.source(e) for e in examples]
        for rollout, example in zip(rollouts, inner, strict=True):  # the ids its reward functions know
            rollout.example_id = example.id
        try:
            await env.rubric.score_group(rollouts, inner)
        finally:
            for rollout, example in zip(rollouts, examples, strict=True):
                rollout.example_id = example.id
        every = self.group.metric_names()
        for rollout in rollouts:
            if rollout.reward is not None:
                for n in every:
                    rollout.metrics.setdefault(n, 0.0)


class EnvGroup(Environment):
    """Environments run as one: ``envs`` maps a name to an environment; ``weights`` (optional) the mix.

    ``pass_threshold`` is the environments' own when they agree, else 0.5; each environment keeps
    its own sampling, timeout, tools and stop conditions.
    """

    def __init__(
        self, envs: Mapping[str, Environment], *, weights: Mapping[str, float] | None = None
    ) -> None:
        if not envs:
            raise ValueError("an EnvGroup needs at least one environment")
        for name, env in envs.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"environment names must be non-empty strings, got {name!r}")
            if not isinstance(env, Environment):
                raise TypeError(f"envs[{name!r}] is a {type(env).__name__}, not an Environment")
            if not env.examples:
                raise ValueError(f"environment {name!r} has no examples")
        if weights is not None:
            if set(weights) != set(envs):
                raise ValueError(f"weights must name exactly the environments: {', '.join(envs)}")
            bad = {n: w for n, w in weights.items() if not (isinstance(w, (int, float)) and w > 0)}
            if bad:
                raise ValueError(f"weights must be positive numbers, got {bad}")
        self.envs = dict(envs)
        self.weights = dict(weights) if weights is not None else None
        thresholds = {env.pass_threshold for env in self.envs.values()}
        super().__init__(pass_threshold=thresholds.pop() if len(thresholds) == 1 else 0.5)
        self._sources: list[Example] = []
        self.examples = []
        for i, (name, index) in enumerate(
            schedule({n: len(e.examples) for n, e in self.envs.items()}, weights)
        ):
            source = self.envs[name].examples[index]
            self._sources.append(source)
            self.examples.append(dataclasses.replace(source, id=i, env=name))
        self.rubric = EnvGroupRubric(self)

    def source(self, example: Example) -> Example:
        """The environment's own example behind a row of the group."""
        return self._sources[example.id]

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The first row's environment's (what a template check renders with the first prompt)."""
        first = self.examples[0].env
        return self.envs[first].tool_schemas() if first is not None else None

    def metric_names(self) -> list[str]:
        return sorted({n for env in self.envs.values() for n in env.metric_names()})

    def metric_info(self) -> dict[str, dict[str, Any]]:
        """Every environment's metrics; a name two of them share keeps the first's weight and direction."""
        out: dict[str, dict[str, Any]] = {}
        for env in self.envs.values():
            for name, info in env.metric_info().items():
                out.setdefault(name, info)
        return dict(sorted(out.items()))

    def run_notes(self) -> dict[str, str]:
        return {
            f"{name}: {key}": note for name, env in self.envs.items() for key, note in env.run_notes().items()
        }

    def env_pass_thresholds(self) -> dict[str, float] | None:
        """Each environment's own pass threshold: its rollouts pass or fail by it."""
        return {name: env.pass_threshold for name, env in self.envs.items()}

    def env_metric_names(self) -> dict[str, list[str]] | None:
        """Each environment's own metrics, for per-environment summaries."""
        return {name: env.metric_names() for name, env in self.envs.items()}

    async def rollout(
        self,
        client: ModelClient,
        example: Example,
        *,
        rollout_index: int = 0,
        seed: int = 0,
        sampling: Sampling | None = None,
    ) -> Rollout:
        """Run the row with its own environment; ``sampling``'s set fields override that env's."""
        assert example.env is not None
        env = self.envs[example.env]
        if sampling is not None and sampling is not self.sampling:
            given = {k: v for k, v in dataclasses.asdict(sampling).items() if v not in (None, {}, False)}
            sampling = env.sampling.replace(**given)
        else:
            sampling = None  # the environment's own
        rollout = await env.rollout(
            client, self.source(example), rollout_index=rollout_index, seed=seed, sampling=sampling
        )
        rollout.example_id = example.id
        rollout.env = example.env
        return rollout

    async def aclose(self) -> None:
        await asyncio.gather(*(env.aclose() for env in self.envs.values()))


def load_environment(
    envs: Mapping[str, Mapping[str, Any]] | Sequence[str], weights: Mapping[str, float] | None = None
) -> EnvGroup:
    """``palaestra eval group -a '{"envs": {"reverse_text": {}, "tictactoe": {"random_move_prob": 1}}}'``.

    ``envs`` maps installed environment names to their ``load_environment`` arguments (a list of
    names: no arguments); ``weights``, if given, names each of them.
    """
    from palaestra.registry import load_environment as load

    if isinstance(envs, str) or not isinstance(envs, (Mapping, Sequence)):
        raise ValueError(
            'envs must be a JSON object of environment names to arguments, e.g. {"reverse_text": {}}'
        )
    table = dict(envs) if isinstance(envs, Mapping) else {name: {} for name in envs}
    for name, args in table.items():
        if not isinstance(args, Mapping):
            raise ValueError(f"envs[{name!r}] must be an object of load_environment arguments, got {args!r}")
    return EnvGroup({name: load(name, **args) for name, args in table.items()}, weights=weights)

"""``evaluate``: run an environment against a model, save every rollout as it finishes, summarise.

A run is saved under ``output_dir/evals/<env>--<model>/<run-id>/`` (see ``store.py``). Each
group of rollouts is appended as soon as it is scored; ``metadata.json`` is written at the start
(status ``running``), and rewritten at the end with the summary (``complete``) or, when the run is
interrupted or fails, with what was saved (``interrupted``). ``resume`` finishes such a run: it
keeps every complete group already saved, drops partial groups and unreadable lines, and runs
only what is missing, so the run ends with exactly ``n × rollouts_per_example`` rollouts.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import palaestra
from palaestra.clients.base import ModelClient
from palaestra.engine import stream_groups
from palaestra.envs.base import Environment
from palaestra.eval.progress import EvalProgress
from palaestra.eval.store import EvalRun, RunMetadata, RunStore, load_run
from palaestra.eval.summary import summarize
from palaestra.types import Rollout, RunSpec

__all__ = ["EvalRun", "evaluate", "load_run"]


async def evaluate(
    env: Environment,
    client: ModelClient,
    spec: RunSpec | None = None,
    *,
    output_dir: Path | str | None = "outputs",
    env_id: str = "env",
    env_args: dict[str, Any] | None = None,
    resume: Path | str | None = None,
    progress: bool | None = False,
    on_rollout: Callable[[Rollout], None] | None = None,
) -> EvalRun:
    """Evaluate ``client`` on ``env`` as ``spec`` says, saving each group as it is scored.

    ``output_dir=None`` keeps everything in memory. ``resume`` finishes the saved run in that
    directory with its own saved spec (``spec`` may then only change ``max_concurrent``).
    ``progress``: ``True`` for a Rich bar (plain lines when stderr is not a terminal), ``None``
    for plain lines, ``False`` for nothing.
    """
    store: RunStore | None = None
    kept: list[Rollout] = []
    if resume is not None:
        store = RunStore.open(Path(resume))
        metadata = store.read_metadata()
        if spec is not None:
            metadata.spec = metadata.spec.replace(max_concurrent=spec.max_concurrent)
        spec = metadata.spec
        examples = env.select(spec.num_examples)
        kept = _complete_groups(store, {e.id for e in examples}, spec.rollouts_per_example)
    else:
        spec = spec or RunSpec()
        examples = env.select(spec.num_examples)
        metadata = _new_metadata(env, client, env_id, env_args, spec)
        if output_dir is not None:
            store = RunStore.create(Path(output_dir), env_id, client.model)
            metadata.run_id = store.path.name
    r = spec.rollouts_per_example
    done_ids = {rollout.example_id for rollout in kept}
    todo = [e for e in examples if e.id not in done_ids]
    metadata.status, metadata.finished_at = "running", None
    if store is not None:
        store.write_metadata(metadata)

    rollouts = list(kept)
    bar = None
    if progress is not False:  # True: a bar where stderr is a terminal; None: plain lines
        bar = EvalProgress(len(examples) * r, done=len(kept), plain=None if progress else True)
    status = "interrupted"
    try:
        groups = stream_groups(env, client, todo, spec)
        async with contextlib.aclosing(groups):
            with bar if bar is not None else contextlib.nullcontext():
                async for group in groups:
                    if store is not None:
                        store.append(group)
                    rollouts.extend(group)
                    for rollout in group:
                        if bar is not None:
                            bar.update(rollout)
                        if on_rollout is not None:
                            on_rollout(rollout)
        status = "complete"
    finally:
        rollouts.sort(key=lambda x: (x.example_id, x.rollout_index))
        metadata.status, metadata.finished_at = status, _now()
        metadata.counts = {
            "expected": len(examples) * r,
            "saved": len(rollouts),
            "errors": sum(x.error is not None for x in rollouts),
        }
        metadata.summary = summarize(rollouts, rollouts_per_example=r, pass_threshold=metadata.pass_threshold)
        if store is not None:
            store.write_metadata(metadata)
    return EvalRun(path=store.path if store else None, metadata=metadata, rollouts=rollouts)


def _complete_groups(store: RunStore, wanted: set[int], r: int) -> list[Rollout]:
    """Saved rollouts of complete groups; rewrites the file if anything had to be dropped."""
    saved, skipped = store.load_rollouts()
    by_example: dict[int, dict[int, Rollout]] = defaultdict(dict)
    for rollout in saved:
        by_example[rollout.example_id].setdefault(rollout.rollout_index, rollout)
    kept = [
        group[i]
        for example_id, group in sorted(by_example.items())
        if example_id in wanted and set(group) == set(range(r))
        for i in range(r)
    ]
    if skipped or len(kept) != len(saved):
        store.rewrite(kept)
    return kept


def _new_metadata(
    env: Environment, client: ModelClient, env_id: str, env_args: dict[str, Any] | None, spec: RunSpec
) -> RunMetadata:
    return RunMetadata(
        env_id=env_id,
        model=client.model,
        spec=spec.replace(sampling=spec.sampling or env.sampling),
        env_args=env_args or {},
        base_url=getattr(client, "base_url", None),
        api_key_var=getattr(client, "api_key_var", None),
        pass_threshold=env.pass_threshold,
        versions={
            "palaestra": palaestra.__version__,
            "env_package": _env_package(env_id),
            "python": platform.python_version(),
        },
        started_at=_now(),
    )


def _env_package(env_id: str) -> str | None:
    from palaestra.registry import installed_environments

    ep = installed_environments().get(env_id)
    dist = getattr(ep, "dist", None) if ep is not None else None
    return f"{dist.name} {dist.version}" if dist is not None else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

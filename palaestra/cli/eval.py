"""``palaestra eval``: flags → environment, client and sampling → ``evaluate`` → summary on screen.

Everything that can be checked before work starts is checked first (flags, environment and its
arguments, API key, server reachable), so a mistake costs one line and no compute.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

import palaestra as pa
from palaestra.cli.common import (
    DEFAULT_MODEL,
    UsageError,
    add_client_arguments,
    close_client,
    make_client,
    make_sampling,
    parse_json_object,
)
from palaestra.eval.run import evaluate
from palaestra.eval.store import EvalRun, RunStore
from palaestra.eval.summary import pick_sample, render_rollout, render_summary
from palaestra.registry import eval_defaults
from palaestra.runner import run_async
from palaestra.types import RunSpec


def add_eval_arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument("env", nargs="?", help="environment name (see `palaestra envs`); not with --resume")
    ev.add_argument("-a", "--env-args", default=None, help="JSON object passed to load_environment")
    add_client_arguments(ev, model_required=False)
    ev.add_argument("-n", "--num-examples", type=int, default=None, help="examples (default 5; -1 all)")
    ev.add_argument("-r", "--rollouts-per-example", type=int, default=None, help="default 3")
    ev.add_argument("-c", "--max-concurrent", type=int, default=32, help="model requests in flight")
    ev.add_argument("-S", "--sampling", default=None, help="JSON sampling args, e.g. '{\"top_p\": 0.9}'")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("-o", "--output-dir", type=Path, default=Path("outputs"))
    ev.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR", help="finish an interrupted run")
    ev.add_argument("--save-dataset", type=Path, default=None, metavar="PATH", help="also save a HF dataset")
    ev.add_argument("--quiet", action="store_true", help="plain progress lines, no sample rollout")


def cmd_eval(args: argparse.Namespace) -> int:
    console = Console()
    if args.resume is not None:
        settings = _resume_settings(args)
    else:
        if not args.env:
            raise UsageError("give an environment (or --resume RUN_DIR)")
        settings = _fresh_settings(args)
    env = pa.load_environment(settings.env_id, **settings.env_args)
    spec = settings.spec
    env.select(spec.num_examples)  # no examples to run is a usage error, found before any request
    if spec.sampling is None:
        spec = spec.replace(sampling=make_sampling(env.sampling, args))
    client = make_client(settings.model, settings.base_url, settings.api_key_var, spec.max_concurrent)

    async def go() -> EvalRun:
        try:
            if isinstance(client, pa.OpenAIClient):
                await client.check()
            return await evaluate(
                env,
                client,
                spec,
                output_dir=args.output_dir,
                env_id=settings.env_id,
                env_args=settings.env_args,
                resume=args.resume,
                progress=None if args.quiet else True,
            )
        finally:
            await close_client(client)

    try:
        run = run_async(go())
    except (KeyboardInterrupt, asyncio.CancelledError):
        saved = _latest_run(args, settings)
        hint = f"; resume with: palaestra eval --resume {saved}" if saved else ""
        raise KeyboardInterrupt(f"interrupted{hint}") from None
    title = f"{settings.env_id} · {settings.model} · {run.metadata.counts['saved']} rollouts"
    render_summary(console, run.summary, title=title)
    sample = pick_sample(run.rollouts)
    if sample is not None and not args.quiet:
        render_rollout(console, sample)
    if args.save_dataset is not None:
        from palaestra.data.rollouts import save_dataset

        save_dataset(run.rollouts, args.save_dataset)
        console.print(f"dataset: {args.save_dataset}", soft_wrap=True)
    if run.path is not None:
        console.print(f"saved: {run.path}", soft_wrap=True)
    return 0


@dataclass(frozen=True)
class Settings:
    """What ``palaestra eval`` runs: from the flags, or from a saved run's metadata."""

    env_id: str
    env_args: dict[str, Any]
    model: str
    base_url: str
    api_key_var: str
    spec: RunSpec  # sampling None: the environment's, with -S/-t/-T applied


def _fresh_settings(args: argparse.Namespace) -> Settings:
    defaults = eval_defaults(args.env)
    env_args = (
        parse_json_object(args.env_args, "-a") if args.env_args is not None else defaults.get("env_args", {})
    )
    n = args.num_examples if args.num_examples is not None else defaults.get("num_examples", 5)
    r = args.rollouts_per_example
    r = r if r is not None else defaults.get("rollouts_per_example", 3)
    try:
        spec = RunSpec(
            num_examples=n, rollouts_per_example=r, max_concurrent=args.max_concurrent, seed=args.seed
        )
    except ValueError as exc:
        raise UsageError(_flag_error(str(exc))) from None
    return Settings(args.env, env_args, args.model or DEFAULT_MODEL, args.base_url, args.api_key_var, spec)


def _flag_error(message: str) -> str:
    """A RunSpec error in the terms of the command's flags."""
    for name, flag in (("num_examples", "-n"), ("rollouts_per_example", "-r"), ("max_concurrent", "-c"),
                       ("seed", "--seed")):  # fmt: skip
        if message.startswith(name):
            return flag + message.removeprefix(name)
    return message


def _resume_settings(args: argparse.Namespace) -> Settings:
    """The saved run's own settings; only -c (concurrency) and -k (key variable) may change."""
    meta = RunStore.open(args.resume).read_metadata()
    given = [flag for flag, value in (("ENV", args.env), ("-m", args.model), ("-a", args.env_args),
             ("-n", args.num_examples), ("-r", args.rollouts_per_example), ("-S", args.sampling),
             ("-t", args.max_tokens), ("-T", args.temperature)) if value is not None]  # fmt: skip
    if given:
        raise UsageError(f"--resume uses the run's saved settings; drop {', '.join(given)}")
    try:
        spec = meta.spec.replace(max_concurrent=args.max_concurrent)
    except ValueError as exc:
        raise UsageError(_flag_error(str(exc))) from None
    return Settings(
        env_id=meta.env_id,
        env_args=meta.env_args,
        model=meta.model,
        base_url=meta.base_url or args.base_url,
        api_key_var=meta.api_key_var or args.api_key_var,
        spec=spec,
    )


def _latest_run(args: argparse.Namespace, settings: Settings) -> Path | None:
    """The run directory an interrupted command was writing (for the resume hint)."""
    if args.resume is not None:
        return args.resume
    from palaestra.eval.store import run_dir_name

    folder = args.output_dir / "evals" / run_dir_name(settings.env_id, settings.model)
    runs = sorted(p for p in folder.glob("*") if p.is_dir()) if folder.is_dir() else []
    return runs[-1] if runs else None

"""``palaestra eval``: flags → environment, client and sampling → ``evaluate`` → summary on screen.

Everything that can be checked before work starts is checked first (flags, environment and its
arguments, the dataset path, API key, server reachable and serving the model), so a mistake
costs one line and no compute. An interrupted run (Ctrl-C, SIGTERM, SIGHUP, a server that went
away) is saved and the command prints how to resume it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

import palaestra as pa
from palaestra.cli.common import (
    DEFAULT_MODEL,
    SCRIPTED_PREFIX,
    ClientOptions,
    UsageError,
    add_client_arguments,
    close_client,
    is_local_model,
    make_client,
    make_sampling,
    parse_json_object,
)
from palaestra.clients.routed import RoutedClient
from palaestra.eval.ray_executor import ExecutorError, RayExecutor  # Ray itself is imported on use
from palaestra.eval.run import evaluate, resume_plan
from palaestra.eval.store import EvalRun, RunStore
from palaestra.eval.summary import pick_sample
from palaestra.eval.summary_view import render_rollout, render_summary
from palaestra.registry import eval_defaults
from palaestra.runner import run_async
from palaestra.types import RunSpec

RESUME_KEEPS = (
    "-c, -b, -k, --no-api-key, --request-timeout, --max-retries, --max-failures-in-a-row, --quiet, "
    "--save-dataset, --executor, --workers"
)


def add_eval_arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument("env", nargs="?", help="environment name (see `palaestra envs`); not with --resume")
    ev.add_argument("-a", "--env-args", default=None, help="JSON object passed to load_environment")
    add_client_arguments(ev, model_required=False)
    ev.add_argument("-n", "--num-examples", type=int, default=None, help="examples (default 5; -1 all)")
    ev.add_argument("-r", "--rollouts-per-example", type=int, default=None, help="default 3")
    ev.add_argument("-c", "--max-concurrent", type=int, default=32, help="model requests in flight")
    ev.add_argument("-S", "--sampling", default=None, help="JSON sampling args, e.g. '{\"top_p\": 0.9}'")
    ev.add_argument("--seed", type=int, default=None, help="default 0")
    ev.add_argument(
        "--max-failures-in-a-row",
        type=int,
        default=20,
        metavar="N",
        help="stop (resumable) after N model requests in a row fail; 0 never stops (20)",
    )
    ev.add_argument("-o", "--output-dir", type=Path, default=None, help="default ./outputs")
    ev.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help=f"finish an interrupted run with its saved settings (may change: {RESUME_KEEPS})",
    )
    ev.add_argument("--save-dataset", type=Path, default=None, metavar="PATH", help="also save a HF dataset")
    ev.add_argument("--quiet", action="store_true", help="plain progress lines, no sample rollout")
    ev.add_argument(
        "--executor",
        default="local",
        metavar="local|ray[=ADDRESS]",
        help="where rollouts run: this process (local, the default), Ray workers on a new local cluster "
        "(ray) or on a running one (ray=auto, ray=HOST:PORT, ray=ray://HOST:PORT); see docs/scaling.md",
    )
    ev.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="Ray rollout workers (default: one per CPU of the cluster)",
    )


@dataclass(frozen=True)
class Settings:
    """What ``palaestra eval`` runs: from the flags, or from a saved run's metadata."""

    env_id: str
    env_args: dict[str, Any]
    client: ClientOptions
    spec: RunSpec  # sampling None: the environment's, with -S/-t/-T applied


def cmd_eval(args: argparse.Namespace) -> int:
    console = Console()
    if args.save_dataset is not None:
        _check_dataset_path(args.save_dataset)
    if args.resume is not None:
        settings = _resume_settings(args)
    else:
        if not args.env:
            raise UsageError("give an environment (or --resume RUN_DIR)")
        settings = _fresh_settings(args)
    env = pa.load_environment(settings.env_id, **settings.env_args)
    spec = settings.spec
    env.select(spec.num_examples)  # too few examples is a usage error, found before any request
    if spec.sampling is None:
        spec = spec.replace(sampling=make_sampling(env.sampling, args))
    if args.resume is not None:
        _say_what_resume_does(console, args.resume, env, spec)
    _warn_of_training_overlap(settings.client.model, env, spec)
    executor = _executor(
        args, settings
    )  # before the model loads: a cluster that cannot be joined costs nothing
    client = make_client(settings.client, spec.max_concurrent)
    started: list[Path] = [args.resume] if args.resume is not None else []

    async def go() -> EvalRun:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGTERM, signal.SIGHUP):  # like Ctrl-C: save, then say how to resume
                loop.add_signal_handler(sig, task.cancel)
        try:
            if executor is not None:  # a node without the environment: one line, before any write
                try:
                    await executor.start(spec)
                except ExecutorError as exc:
                    raise UsageError(str(exc)) from None
            if isinstance(client, pa.OpenAIClient):
                await client.check()
            elif isinstance(client, RoutedClient):
                for problem in await client.check():  # drained: the others take its share
                    print(
                        f"palaestra: warning: {problem}; the other endpoints take its groups", file=sys.stderr
                    )
            return await evaluate(
                env,
                client,
                spec,
                output_dir=args.output_dir or Path("outputs"),
                env_id=settings.env_id,
                env_args=settings.env_args,
                resume=args.resume,
                progress=None if args.quiet else True,
                on_start=started.append,
                executor=executor,
            )
        finally:
            await close_client(client)
            await env.aclose()

    try:
        run = run_async(go())
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise KeyboardInterrupt(f"interrupted{_resume_hint(started, settings.client.model)}") from None
    except pa.ModelUnavailable as exc:
        raise Stopped(f"{exc}{_resume_hint(started, settings.client.model)}") from None
    except ExecutorError as exc:  # the Ray workers all died, or a node lacks the environment
        raise Stopped(f"{exc}{_resume_hint(started, settings.client.model)}") from None
    title = f"{settings.env_id} · {settings.client.model} · {run.metadata.counts['saved']} rollouts"
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


class Stopped(Exception):
    """The run stopped early for a reason outside the user's input (a server that went away)."""


def _executor(args: argparse.Namespace, settings: Settings) -> RayExecutor | None:
    """``--executor``: None for this process, else a ``RayExecutor`` connected to its cluster."""
    kind, eq, address = args.executor.partition("=")
    if kind == "local" and not eq:
        if args.workers is not None:
            raise UsageError("--workers is for --executor ray")
        return None
    if kind != "ray" or (eq and not address):
        raise UsageError(f"--executor {args.executor}: expected local, ray or ray=ADDRESS")
    if settings.client.base_url is None and is_local_model(settings.client.model):
        raise UsageError(
            f"--executor ray: -m {settings.client.model} is a model loaded in this process; serve it "
            "(palaestra serve, vLLM) and give its endpoint with -b"
        )
    try:
        return RayExecutor(
            settings.env_id, settings.env_args, settings.client, address=address or None, workers=args.workers
        )
    except ExecutorError as exc:
        raise UsageError(str(exc)) from None


def _warn_of_training_overlap(model: str, env: pa.Environment, spec: RunSpec) -> None:
    """A warning when the examples to run were prompts of the SFT run that made ``model``."""
    from palaestra.train.overlap import overlapping, train_prompts_for

    if model.startswith(SCRIPTED_PREFIX):
        return
    found = train_prompts_for(model.removeprefix("local:"))
    if found is None:
        return
    run_dir, trained = found
    examples = env.select(spec.num_examples)
    shared = overlapping([e.prompt for e in examples], trained, [e.prompt for e in env.examples])
    if shared:
        print(
            f"palaestra: warning: {shared} of the {len(examples)} examples to run were prompts of the SFT "
            f"data of {model} ({run_dir}): the evaluation overlaps the training data; give the "
            "environment another seed or split (-a)",
            file=sys.stderr,
        )


def _resume_hint(started: list[Path], model: str) -> str:
    """How to resume: a scripted run must name its policy again (a saved file never names code to run)."""
    if not started:
        return ""
    again = f" -m {shlex.quote(model)}" if model.startswith(SCRIPTED_PREFIX) else ""
    return f"; resume with: palaestra eval --resume {shlex.quote(str(started[0]))}{again}"


def _fresh_settings(args: argparse.Namespace) -> Settings:
    defaults = eval_defaults(args.env)
    env_args = (
        parse_json_object(args.env_args, "-a") if args.env_args is not None else defaults.get("env_args", {})
    )
    try:
        orjson.dumps(env_args)
    except TypeError as exc:  # e.g. an integer beyond 64 bits, which no saved run could hold
        raise UsageError(f"-a: {exc}") from None
    n = args.num_examples if args.num_examples is not None else defaults.get("num_examples", 5)
    r = args.rollouts_per_example
    r = r if r is not None else defaults.get("rollouts_per_example", 3)
    spec = _spec(
        num_examples=n,
        rollouts_per_example=r,
        max_concurrent=args.max_concurrent,
        seed=args.seed if args.seed is not None else 0,
        max_failures_in_a_row=args.max_failures_in_a_row,
    )
    return Settings(args.env, env_args, ClientOptions.from_args(args, args.model or DEFAULT_MODEL), spec)


def _spec(**fields: Any) -> RunSpec:
    """A RunSpec whose errors name the command's flags."""
    try:
        return RunSpec(**fields)
    except ValueError as exc:
        message = str(exc)
        for name, flag in (
            ("num_examples", "-n"),
            ("rollouts_per_example", "-r"),
            ("max_concurrent", "-c"),
            ("seed", "--seed"),
            ("max_failures_in_a_row", "--max-failures-in-a-row"),
        ):
            if message.startswith(name):
                message = flag + message.removeprefix(name)
        raise UsageError(message) from None


def _resume_settings(args: argparse.Namespace) -> Settings:
    """The saved run's own settings; only how the model is reached and the concurrency may change."""
    meta = RunStore.open(args.resume).read_metadata()
    given = [
        flag
        for flag, value in (
            ("ENV", args.env),
            ("-a", args.env_args),
            ("-n", args.num_examples),
            ("-r", args.rollouts_per_example),
            ("-S", args.sampling),
            ("-t", args.max_tokens),
            ("-T", args.temperature),
            ("--seed", args.seed),
            ("-o", args.output_dir),
        )
        if value is not None
    ]
    if given:
        raise UsageError(
            f"--resume uses the run's saved settings; drop {', '.join(given)} (it may change {RESUME_KEEPS})"
        )
    if args.model is not None and args.model != meta.model:
        raise UsageError(f"--resume runs the saved model {meta.model!r}; -m {args.model} differs")
    if meta.model.startswith(SCRIPTED_PREFIX) and args.model is None:
        # a saved file must never name code to run: the command line has to say it again
        raise UsageError(f"this run's model is a Python policy; confirm it with -m {meta.model}")
    spec = _spec(
        num_examples=meta.spec.num_examples,
        rollouts_per_example=meta.spec.rollouts_per_example,
        max_concurrent=args.max_concurrent,
        seed=meta.spec.seed,
        max_failures_in_a_row=args.max_failures_in_a_row,
    )
    spec = spec.replace(sampling=meta.spec.sampling)
    client = ClientOptions.from_args(args, meta.model)
    client = replace(
        client,
        base_url=args.base_url or meta.base_url,
        api_key_var=args.api_key_var or meta.api_key_var,
    )
    return Settings(meta.env_id, meta.env_args, client, spec)


def _say_what_resume_does(console: Console, path: Path, env: pa.Environment, spec: RunSpec) -> None:
    plan = resume_plan(RunStore.open(path), env.select(spec.num_examples), spec.rollouts_per_example)
    parts = [f"{plan.groups_kept} of {plan.groups_total} groups saved"]
    if plan.groups_failed:
        parts.append(f"re-running {plan.groups_failed} whose model requests failed")
    if plan.lines_unreadable:
        parts.append(f"{plan.lines_unreadable} unreadable lines dropped")
    console.print("resume: " + "; ".join(parts), soft_wrap=True)


def _check_dataset_path(path: Path) -> None:
    """Fail before the run if ``--save-dataset`` could not be written after it."""
    try:
        import datasets  # noqa: F401 - only whether it imports
    except ImportError:
        raise UsageError(
            "--save-dataset needs the datasets package: pip install 'palaestra[datasets]'"
        ) from None
    if path.exists() and not path.is_dir():
        raise UsageError(f"--save-dataset {path}: exists and is not a folder")
    parent = path.parent if not path.exists() else path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--save-dataset {path}: cannot write under {parent}")

"""The ``palaestra`` command. Thin: it parses arguments, calls the library and prints.

Bad input (a wrong flag, an unknown environment, bad JSON, a missing API key) gets one clear line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import sys
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

import palaestra as pa

T = TypeVar("T")


class UsageError(Exception):
    """Input the user can fix; printed as one line."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (
        UsageError,
        pa.EnvironmentNotFound,
        pa.EnvironmentArgsError,
        pa.BindingError,
        ValueError,
        OSError,
    ) as exc:
        # ValueError covers ClientConfigError and DatasetError; OSError a path `init` cannot write
        print(f"palaestra: error: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="palaestra", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"palaestra {pa.__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    ev = sub.add_parser("eval", help="run an environment against a model and print a summary")
    ev.add_argument("env", help="environment name (an installed package; see `palaestra envs`)")
    ev.add_argument("-a", "--env-args", default="{}", help="JSON object passed to load_environment")
    ev.add_argument(
        "-m", "--model", required=True,
        help="model name at the endpoint, or scripted:MODULE:FUNCTION for a Python policy",
    )  # fmt: skip
    ev.add_argument("-b", "--base-url", default="https://api.openai.com/v1")
    ev.add_argument("-k", "--api-key-var", default="OPENAI_API_KEY")
    ev.add_argument("-n", "--num-examples", type=int, default=5)
    ev.add_argument("-r", "--rollouts-per-example", type=int, default=3)
    ev.add_argument("-c", "--max-concurrent", type=int, default=32)
    ev.add_argument("-t", "--max-tokens", type=int, default=None)
    ev.add_argument("-T", "--temperature", type=float, default=None)
    ev.add_argument("--seed", type=int, default=0)
    ev.set_defaults(func=cmd_eval)

    init = sub.add_parser("init", help="create a new environment package")
    init.add_argument("name")
    init.add_argument("--path", type=Path, default=Path("environments"), help="parent folder")
    init.set_defaults(func=cmd_init)

    envs = sub.add_parser("envs", help="list installed environments")
    envs.set_defaults(func=cmd_envs)
    return parser


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop (a faster event loop) where it is installed, else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def make_client(args: argparse.Namespace) -> pa.ModelClient:
    if args.model.startswith("scripted:"):
        target = args.model.removeprefix("scripted:")
        module_name, _, func_name = target.partition(":")
        if not module_name or not func_name:
            raise UsageError(f"-m {args.model}: expected scripted:MODULE:FUNCTION")
        try:
            policy = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"-m {args.model}: cannot load {target} ({exc})") from None
        return pa.ScriptedClient(policy, model=target)
    return pa.OpenAIClient(
        args.model,
        base_url=args.base_url,
        api_key_var=args.api_key_var,
        max_connections=args.max_concurrent,
    )


def parse_env_args(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"-a is not valid JSON ({exc.msg} at position {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise UsageError(f"-a must be a JSON object, got {text!r}")
    return value


def cmd_eval(args: argparse.Namespace) -> int:
    for flag, value in (("-r", args.rollouts_per_example), ("-c", args.max_concurrent)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    env = pa.load_environment(args.env, **parse_env_args(args.env_args))
    client = make_client(args)
    sampling = env.sampling.replace(
        **{
            k: v
            for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature))
            if v is not None
        }
    )
    rollouts = run_async(_run(env, client, args, sampling))
    print_summary(Console(), args.env, client.model, rollouts)
    return 0


async def _run(
    env: pa.Environment, client: pa.ModelClient, args: argparse.Namespace, sampling: pa.Sampling
) -> list[pa.Rollout]:
    try:
        return await env.run(
            client,
            n=args.num_examples,
            rollouts_per_example=args.rollouts_per_example,
            max_concurrent=args.max_concurrent,
            seed=args.seed,
            sampling=sampling,
        )
    finally:
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()


def print_summary(console: Console, env_name: str, model: str, rollouts: list[pa.Rollout]) -> None:
    rewards = [r.reward for r in rollouts if r.reward is not None]
    console.print(f"[bold]{env_name}[/bold] with [bold]{model}[/bold]: {len(rollouts)} rollouts")
    table = Table("metric", "mean", "std", "n")
    if rewards:
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
        table.add_row("reward", f"{statistics.fmean(rewards):.4f}", f"{std:.4f}", str(len(rewards)))
    names = sorted({k for r in rollouts for k in r.metrics})
    for name in names:
        values = [r.metrics[name] for r in rollouts if name in r.metrics]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        table.add_row(name, f"{statistics.fmean(values):.4f}", f"{std:.4f}", str(len(values)))
    console.print(table)
    stops = Counter(r.stop_reason for r in rollouts)
    console.print("stop reasons: " + ", ".join(f"{k}={v}" for k, v in stops.most_common()))
    errors = Counter(f"{r.error.stage}/{r.error.type}" for r in rollouts if r.error)
    if errors:
        console.print("[red]errors:[/red] " + ", ".join(f"{k}={v}" for k, v in errors.most_common()))


def cmd_init(args: argparse.Namespace) -> int:
    from palaestra.scaffold import create_environment

    path = create_environment(args.name, args.path)
    print(f"created {path}; install it with: pip install -e {path}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    found = pa.installed_environments()
    for name, ep in sorted(found.items()):
        print(f"{name}\t{ep.value}")
    if not found:
        print("no environments installed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``palaestra env serve``: an installed environment behind HTTP, for trainers in other processes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from palaestra.cli.common import UsageError, parse_json_object


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def add_env_parser(sub: Any) -> None:
    env = sub.add_parser("env", help="serve an environment over HTTP for other trainers (env serve)")
    commands = env.add_subparsers(required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run an installed environment behind an HTTP API (OpenEnv's reset/step/state)",
        description="Serve an environment's episodes over HTTP: POST /reset, POST /step, GET /state, "
        "GET /examples, GET /metadata, POST /score, POST /close. The wire format is in docs/interop.md.",
    )
    serve.add_argument("env", help="environment name")
    serve.add_argument("-a", "--env-args", default="{}", help="JSON object passed to load_environment")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100, help="0 picks a free port")
    serve.add_argument(
        "--idle-timeout",
        type=_positive,
        default=300.0,
        metavar="SECONDS",
        help="end an episode whose next step has not come within this time (300)",
    )
    serve.add_argument(
        "--keep-finished",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="release a finished episode (its result) this long after it ended (default: --idle-timeout)",
    )
    serve.add_argument("--max-episodes", type=int, default=1024, help="episodes open at once (1024)")
    serve.set_defaults(func=cmd_env_serve)


def cmd_env_serve(args: argparse.Namespace) -> int:
    import palaestra as pa
    from palaestra.interop.server import serve_env

    if args.max_episodes < 1:
        raise UsageError(f"--max-episodes must be at least 1, not {args.max_episodes}")
    env = pa.load_environment(args.env, **parse_json_object(args.env_args, "-a"))
    if not env.examples:
        raise UsageError(f"environment {args.env!r} has no examples to serve")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"palaestra: warning: serving {args.env} on {args.host}: anyone who can reach it can use it",
            file=sys.stderr,
        )
    serve_env(
        env,
        name=args.env,
        host=args.host,
        port=args.port,
        idle_timeout=args.idle_timeout,
        keep_finished=args.keep_finished,
        max_episodes=args.max_episodes,
    )
    return 0

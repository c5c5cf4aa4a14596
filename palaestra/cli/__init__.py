"""The ``palaestra`` command. Thin: it parses arguments, calls the library and prints.

Bad input (a wrong flag, an unknown environment, bad JSON, a missing API key, an unreachable
server) gets one clear line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

import palaestra as pa
from palaestra.cli.common import (
    DEFAULT_MODEL,
    LOCAL_PREFIX,
    ClientOptions,
    OneLineParser,
    UsageError,
    add_client_arguments,
    close_client,
    load_local,
    make_client,
    make_sampling,
    parse_json_object,
)
from palaestra.cli.data import add_data_parser
from palaestra.cli.env import add_env_parser
from palaestra.cli.eval import Stopped, add_eval_arguments, cmd_eval
from palaestra.cli.hub import add_hub_parser, list_hub
from palaestra.cli.train import add_train_parser
from palaestra.eval.store import RunStoreError
from palaestra.hub.client import HubError
from palaestra.hub.database import CatalogError
from palaestra.runner import run_async

API_KEY_VAR = "PALAESTRA_API_KEY"
USER_ERRORS = (
    UsageError,
    pa.EnvironmentNotFound,
    pa.EnvironmentArgsError,
    pa.BindingError,
    pa.ModelError,  # an unreachable server or a rejected key, found before the run starts
    RunStoreError,
    HubError,  # a hub that refused, or cannot be reached
    CatalogError,  # a hub data folder that cannot be opened
    ValueError,  # ClientConfigError, DatasetError, an environment's own argument checks
    OSError,  # a path that cannot be read or written
)


def main(argv: list[str] | None = None) -> int:
    # transformers' and the hub's progress bars (loading weights, writing shards) are noise in a
    # command's output, which prints its own; read when they are first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        print(str(exc) or "interrupted", file=sys.stderr)
        return 130
    except Stopped as exc:
        print(f"palaestra: {exc}", file=sys.stderr)
        return 1
    except USER_ERRORS as exc:
        print(f"palaestra: error: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="palaestra", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"palaestra {pa.__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    ev = sub.add_parser("eval", help="evaluate a model on an environment; save, summarise")
    add_eval_arguments(ev)
    ev.set_defaults(func=cmd_eval)

    add_data_parser(sub)

    report = sub.add_parser("report", help="write an HTML report of one or more saved runs")
    report.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    report.add_argument("-o", "--output", type=Path, default=None, help="the HTML file to write")
    report.set_defaults(func=cmd_report)

    play = sub.add_parser(
        "play",
        help="play an environment yourself in the terminal: you are the model (tictactoe: against one)",
    )
    play.add_argument("env", help="environment name")
    play.add_argument("-a", "--env-args", default="{}", help="JSON object passed to load_environment")
    add_client_arguments(play, model_required=False)
    play.add_argument("--show-thinking", action="store_true", help="print the model's <think> text")
    play.add_argument("--seed", type=int, default=0)
    play.add_argument("--example", type=int, default=None, help="which example to play (default: seed's)")
    play.set_defaults(func=cmd_play)

    serve = sub.add_parser("serve", help="serve a local model over an OpenAI-compatible HTTP API")
    serve.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL, help="smollm2 (default), a path or a hub id"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    serve.add_argument("--max-batch-size", type=int, default=64)
    serve.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        metavar="NAME",
        help="another model name to answer to (repeatable); the MODEL argument is always one",
    )
    serve.add_argument(
        "--api-key-var",
        default=API_KEY_VAR,
        help=f"require 'Authorization: Bearer KEY' with KEY from this env var (default {API_KEY_VAR}, if set)",
    )
    serve.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body accepted (16)")
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="a line per request on stderr: client, request line, status, bytes, seconds (no headers)",
    )
    serve.add_argument(
        "--enable-weight-sync",
        action="store_true",
        help="accept the weight-sync requests of an RL trainer (vLLM's load_lora_adapter, "
        "unload_lora_adapter, collective_rpc reload_weights, reset_prefix_cache); MODEL must be a folder",
    )
    serve.set_defaults(func=cmd_serve)

    init = sub.add_parser("init", help="create a new environment package")
    init.add_argument("name")
    init.add_argument("--path", type=Path, default=Path("environments"), help="parent folder")
    init.add_argument(
        "--kind",
        choices=("single", "multiturn", "tool"),
        default="single",
        help="single: one reply; multiturn: a MultiTurnEnv game; tool: a ToolEnv with a tool",
    )
    init.set_defaults(func=cmd_init)

    add_train_parser(sub)
    add_hub_parser(sub)
    add_env_parser(sub)

    envs = sub.add_parser("envs", help="list installed environments (or, with --hub, a hub's)")
    envs.add_argument(
        "--hub",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="list the environments on a hub instead (default URL: $PALAESTRA_HUB_URL)",
    )
    envs.set_defaults(func=cmd_envs)
    return parser


def cmd_report(args: argparse.Namespace) -> int:
    from palaestra.eval.report import main_report

    path = main_report([str(p) for p in args.runs], str(args.output) if args.output else None)
    print(f"report: {path}")
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    env = pa.load_environment(args.env, **parse_json_object(args.env_args, "-a"))
    play = getattr(env, "play_interactive", None)
    if play is None:  # you are the model
        from palaestra.play import play_as_model

        if args.model is not None or args.base_url is not None:
            raise UsageError(
                f"environment {args.env!r} has no two-player mode: you play the model, so -m and -b are not used"
            )
        try:
            return run_async(
                play_as_model(env, console=Console(), ask=input, seed=args.seed, example=args.example)
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    client = make_client(ClientOptions.from_args(args, args.model or DEFAULT_MODEL), 1)
    sampling = make_sampling(env.sampling, args)

    async def session() -> None:
        try:
            await play(
                client,
                console=Console(),
                ask=input,
                sampling=sampling,
                seed=args.seed,
                show_thinking=args.show_thinking,
            )
        finally:
            await close_client(client)

    try:
        run_async(session())
    except EOFError:  # input closed (Ctrl-D): leave quietly
        print(file=sys.stderr)
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from palaestra.serve import serve
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    api_key = os.environ.get(args.api_key_var) or None
    if args.api_key_var != API_KEY_VAR and api_key is None:
        raise UsageError(f"--api-key-var {args.api_key_var}: that environment variable is not set")
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"palaestra: warning: serving on {args.host} without an API key: anyone who can reach it can "
            f"use it (set {API_KEY_VAR} to require one)",
            file=sys.stderr,
        )
    weights_from = None
    if args.enable_weight_sync:
        from palaestra.clients.default_model import resolve_model

        folder = Path(resolve_model(args.model.removeprefix(LOCAL_PREFIX))).expanduser()
        if not folder.is_dir():
            raise UsageError(
                f"--enable-weight-sync reloads weights from the model's folder: {args.model} is none"
            )
        weights_from = str(folder)
    client = load_local(args.model.removeprefix(LOCAL_PREFIX), max_batch_size=args.max_batch_size)
    names = [args.model, *args.served_model_name]
    serve(
        client,
        host=args.host,
        port=args.port,
        model_names=names,
        api_key=api_key,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        weights_from=weights_from,
        access_log=args.access_log,
    )
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from palaestra.scaffold import create_environment

    path = create_environment(args.name, args.path, args.kind)
    print(f"created {path}; install it with: pip install -e {path}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    if args.hub is not None:
        return list_hub(args.hub)
    found = pa.installed_environments()
    for name, ep in sorted(found.items()):
        print(f"{name}\t{ep.value}")
    if not found:
        print("no environments installed", file=sys.stderr)
    return 0

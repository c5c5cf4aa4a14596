"""What the CLI's commands share: one-line usage errors, building clients, JSON flags."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import palaestra as pa
from palaestra.clients.openai import DEFAULT_BASE_URL

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(pa.Sampling)} - {"extra"}
LOCAL_PREFIX = "local:"
SCRIPTED_PREFIX = "scripted:"
DEFAULT_MODEL = "smollm2"
DEFAULT_KEY_VAR = "OPENAI_API_KEY"


class UsageError(Exception):
    """Input the user can fix; printed as one line."""


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (argparse prints the usage block too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"palaestra: error: {message} (see: {self.prog} --help)\n")


def parse_json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not valid JSON ({exc.msg} at position {exc.pos}): {text!r}") from None
    except RecursionError:
        raise UsageError(f"{flag} is nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object, got {text!r}")
    return value


def add_client_arguments(parser: argparse.ArgumentParser, *, model_required: bool) -> None:
    parser.add_argument(
        "-m",
        "--model",
        required=model_required,
        default=None,
        help="smollm2 (the embedded default), local:PATH_OR_HUB_ID, a model name at the endpoint (-b), "
        "or scripted:MODULE:FUNCTION for a Python policy",
    )
    parser.add_argument(
        "-b",
        "--base-url",
        default=None,
        help=f"OpenAI-compatible endpoint, or several of one model: URL1,URL2,... (least-pending routing, "
        f"a group's requests to one endpoint); given, it is always used, even with -m smollm2 "
        f"(default for API models: {DEFAULT_BASE_URL})",
    )
    parser.add_argument(
        "-k", "--api-key-var", default=None, help=f"env var holding the API key (default {DEFAULT_KEY_VAR})"
    )
    parser.add_argument("--no-api-key", action="store_true", help="the endpoint needs no API key")
    parser.add_argument(
        "--request-timeout", type=float, default=300.0, metavar="SECONDS", help="per request attempt (300)"
    )
    parser.add_argument("--max-retries", type=int, default=3, help="retries of a failed request (3)")
    parser.add_argument("-t", "--max-tokens", type=int, default=None)
    parser.add_argument("-T", "--temperature", type=float, default=None)


@dataclass(frozen=True)
class ClientOptions:
    """How to reach the model: what ``make_client`` needs, from the flags or a saved run."""

    model: str
    base_url: str | None = None  # given: always an OpenAI-compatible endpoint
    api_key_var: str | None = None
    no_api_key: bool = False
    timeout: float = 300.0
    max_retries: int = 3
    extra_body: dict[str, Any] | None = None  # sent with every request (the RL sampler: token ids)

    @classmethod
    def from_args(cls, args: argparse.Namespace, model: str) -> ClientOptions:
        if args.api_key_var is not None and not args.api_key_var.strip():
            raise UsageError("-k needs the name of an environment variable; use --no-api-key for none")
        if not args.request_timeout > 0:
            raise UsageError(
                f"--request-timeout must be a positive number of seconds, got {args.request_timeout}"
            )
        if args.max_retries < 0:
            raise UsageError(f"--max-retries must be at least 0, got {args.max_retries}")
        return cls(
            model, args.base_url, args.api_key_var, args.no_api_key, args.request_timeout, args.max_retries
        )


def is_local_model(model: str) -> bool:
    """Whether ``-m`` names a model to load in this process rather than one behind an endpoint."""
    from palaestra.clients.default_model import SMOLLM2_ALIASES

    return (
        model.lower() in SMOLLM2_ALIASES
        or model.startswith(LOCAL_PREFIX)
        or Path(model).expanduser().exists()
    )


def load_policy(module_name: str, func_name: str, model: str) -> Any:
    """The function ``module_name:func_name``; a ``MODULE.py`` in the current folder is found as
    ``python -m`` would find it (the current folder first), without ``PYTHONPATH=.``."""
    here = str(Path.cwd())
    local = (Path.cwd() / (module_name.split(".")[0] + ".py")).is_file() or (
        Path.cwd() / module_name.split(".")[0] / "__init__.py"
    ).is_file()
    if local and here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = (
            ""
            if local
            else f"; a policy in a file needs it here as {module_name.split('.')[0]}.py, or its folder on PYTHONPATH"
        )
        raise UsageError(f"-m {model}: cannot import {module_name} ({exc}){hint}") from None
    policy = getattr(module, func_name, None)
    if not callable(policy):
        found = ", ".join(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise UsageError(
            f"-m {model}: {module_name} has no function {func_name!r} (it has: {found or 'none'})"
        )
    return policy


def make_client(options: ClientOptions, max_concurrent: int = 32) -> pa.ModelClient:
    """``scripted:MODULE:FUNCTION`` → ScriptedClient; with ``-b`` → OpenAIClient at that endpoint;
    ``smollm2``, ``local:PATH_OR_HUB_ID`` or an existing path → LocalClient (loaded here); anything
    else → OpenAIClient at the default endpoint."""
    model = options.model
    if model.startswith(SCRIPTED_PREFIX):
        target = model.removeprefix(SCRIPTED_PREFIX)
        module_name, _, func_name = target.partition(":")
        if not module_name or not func_name:
            raise UsageError(f"-m {model}: expected scripted:MODULE:FUNCTION")
        return pa.ScriptedClient(load_policy(module_name, func_name, model), model=model)
    if options.base_url is None and is_local_model(model):
        return load_local(model.removeprefix(LOCAL_PREFIX), max_batch_size=max_concurrent)
    urls = [u.strip() for u in (options.base_url or DEFAULT_BASE_URL).split(",")]
    if not all(urls):
        raise UsageError(f"-b {options.base_url}: an empty endpoint in the list (URL1,URL2,...)")
    try:
        clients = [
            pa.OpenAIClient(
                model,
                base_url=url,
                api_key_var=options.api_key_var or DEFAULT_KEY_VAR,
                api_key="" if options.no_api_key else None,
                timeout=options.timeout,
                max_retries=options.max_retries,
                max_connections=max_concurrent,
                extra_body=options.extra_body,
            )
            for url in urls
        ]
    except pa.ClientConfigError as exc:
        raise UsageError(str(exc).replace("pass api_key=''", "give --no-api-key")) from None
    if len(clients) == 1:
        return clients[0]
    from palaestra.clients.routed import RoutedClient  # several endpoints of one model (docs/scaling.md)

    return RoutedClient(clients)


def load_local(model: str, *, max_batch_size: int = 64) -> pa.ModelClient:
    """A LocalClient for ``model``; a missing extra, a folder that is not a model or a model that
    fails to load is one clear line."""
    try:
        from palaestra.clients.local import LocalClient
    except ImportError as exc:
        raise UsageError(
            f"local models need the local extra: pip install 'palaestra[local]' ({exc})"
        ) from None
    path = Path(model).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        raise UsageError(
            f"cannot load local model {model!r}: the folder has no config.json, so it is not a model"
        )
    try:
        return LocalClient(str(path) if path.exists() else model, max_batch_size=max_batch_size)
    except ImportError as exc:  # e.g. the package that ships the default model's weights
        raise UsageError(str(exc)) from None
    except (OSError, ValueError, KeyError) as exc:  # transformers: no such hub id, a broken folder
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"cannot load local model {model!r}: {first_line}") from None


def make_sampling(base: pa.Sampling, args: argparse.Namespace) -> pa.Sampling:
    """``base`` (the environment's) overridden by -S (if the command has it), then -t and -T."""
    changes: dict[str, Any] = {}
    extra = dict(base.extra)
    if getattr(args, "sampling", None):
        for key, value in parse_json_object(args.sampling, "-S").items():
            if key in SAMPLING_FIELDS:
                changes[key] = value
            else:
                extra[key] = value  # passed through to the server as-is (top_k, min_p, ...)
    if args.max_tokens is not None:
        changes["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        changes["temperature"] = args.temperature
    try:
        return base.replace(**changes, extra=extra)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"-S/-t/-T: {exc}") from None


async def close_client(client: pa.ModelClient) -> None:
    close = getattr(client, "aclose", None)
    if close is not None:
        await close()

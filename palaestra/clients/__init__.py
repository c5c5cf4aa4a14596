"""Model clients: the protocol, OpenAI-compatible endpoints and scripted policies."""

from palaestra.clients.base import (
    BadResponseError,
    ModelClient,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelTimeout,
    ModelUnavailable,
    StreamingClient,
    TransientModelError,
)
from palaestra.clients.openai import ClientConfigError, OpenAIClient
from palaestra.clients.scripted import ScriptedClient

__all__ = [
    "BadResponseError",
    "ClientConfigError",
    "ModelClient",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelTimeout",
    "ModelUnavailable",
    "OpenAIClient",
    "ScriptedClient",
    "StreamingClient",
    "TransientModelError",
]


def __getattr__(name: str) -> object:
    """``LocalClient`` is imported on first use: it needs torch and transformers (the local extra)."""
    if name in ("LocalClient", "LocalStats"):
        from palaestra.clients import local

        return getattr(local, name)
    raise AttributeError(f"module 'palaestra.clients' has no attribute {name!r}")

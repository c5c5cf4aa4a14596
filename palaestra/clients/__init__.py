"""Model clients: the protocol, OpenAI-compatible endpoints and scripted policies."""

from palaestra.clients.base import (
    BadResponseError,
    ModelClient,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelTimeout,
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
    "OpenAIClient",
    "ScriptedClient",
    "TransientModelError",
]

"""The ModelClient protocol and the errors every backend raises."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol, runtime_checkable

from palaestra.types import ChatChunk, Messages, ModelResponse, Sampling


@runtime_checkable
class ModelClient(Protocol):
    """Anything that answers a chat: an HTTP endpoint, a local model, a Python function."""

    model: str

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse: ...


@runtime_checkable
class StreamingClient(ModelClient, Protocol):
    """A client that can also stream a reply as it is generated.

    Closing the iterator early (or cancelling the task iterating it) cancels the generation.
    """

    def chat_stream(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> AsyncGenerator[ChatChunk, None]: ...


class ModelError(Exception):
    """A model request failed for good (after any retries). Recorded on the rollout."""


class TransientModelError(ModelError):
    """A failure worth retrying: connection lost, 429, 5xx, timeout."""


class ModelTimeout(TransientModelError):
    """The request did not finish within the client's timeout."""


class ModelConnectionError(TransientModelError):
    """The connection failed or was dropped before a full response arrived."""


class ModelHTTPError(ModelError):
    """The server answered with an error status."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.retry_after = retry_after  # seconds, from a Retry-After header


class TransientHTTPError(ModelHTTPError, TransientModelError):
    """429 or 5xx: the server may answer next time."""


class BadResponseError(ModelError):
    """The server answered 200 with a body that is not a chat completion."""


def http_error(status: int, message: str, retry_after: float | None = None) -> ModelHTTPError:
    """The error for an HTTP status: transient (retried) for 429 and 5xx."""
    if status == 429 or status >= 500:
        return TransientHTTPError(status, message, retry_after)
    return ModelHTTPError(status, message, retry_after)

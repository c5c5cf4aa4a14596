"""verifiers' error classes (0.1.9 ``verifiers/errors.py``), raised by environment code to end a rollout.

A ``vf.Error`` raised in ``setup_state``, ``env_response`` or a model call is caught by the rollout
loop and stored in ``state["error"]``; the ``has_error`` stop condition then ends the rollout.
"""

from __future__ import annotations


class Error(Exception):
    """Base class for all errors."""


class ModelError(Error):
    """Used to catch errors while interacting with the model."""


class EmptyModelResponseError(ModelError):
    """Used to catch empty or invalid model responses (e.g. response.choices is None)."""


class OverlongPromptError(Error):
    """Used to catch overlong prompt errors (prompt + requested tokens exceed the context length)."""


class ToolError(Error):
    """Parent class for all tool errors."""


class ToolParseError(ToolError):
    """Used to catch errors while parsing tool calls."""


class ToolCallError(ToolError):
    """Used to catch errors while calling tools."""


class InfraError(Error):
    """Used to catch errors while interacting with infrastructure."""


class SandboxError(InfraError):
    """Used to catch errors while interacting with sandboxes."""


__all__ = [
    "EmptyModelResponseError",
    "Error",
    "InfraError",
    "ModelError",
    "OverlongPromptError",
    "SandboxError",
    "ToolCallError",
    "ToolError",
    "ToolParseError",
]

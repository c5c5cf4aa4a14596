"""Palaestra: build an environment once; evaluate, generate data and train with it.

``import palaestra as pa`` gives the whole public API.
"""

from palaestra._version import __version__
from palaestra.binding import BindingError
from palaestra.clients import (
    BadResponseError,
    ClientConfigError,
    ModelClient,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelTimeout,
    ModelUnavailable,
    OpenAIClient,
    ScriptedClient,
    StreamingClient,
    TransientModelError,
)
from palaestra.envs import (
    DatasetError,
    EnvGroup,
    Environment,
    EpisodeError,
    Final,
    MultiTurnEnv,
    ReplEnv,
    RLMEnv,
    RolloutTimeout,
    SingleTurnEnv,
    StatefulToolEnv,
    ToolEnv,
    stop,
)
from palaestra.eval import EvalRun, RunMetadata, evaluate, load_run
from palaestra.judge import JudgeError, JudgeRubric
from palaestra.parsers import Parser, ThinkParser, XMLParser
from palaestra.registry import (
    EnvironmentArgsError,
    EnvironmentNotFound,
    installed_environments,
    load_environment,
)
from palaestra.rubric import RewardError, Rubric, RubricGroup, group_reward
from palaestra.sandbox import ReplLimits, SandboxUnavailable
from palaestra.tools import Tool, ToolArgumentError, ToolDefinitionError
from palaestra.types import (
    ChatChunk,
    ErrorInfo,
    Example,
    Message,
    Messages,
    ModelResponse,
    Rollout,
    RunSpec,
    Sampling,
    State,
    Timing,
    Turn,
    Usage,
    content_text,
    derive_seed,
)

__all__ = [
    "BadResponseError",
    "BindingError",
    "ChatChunk",
    "ClientConfigError",
    "DatasetError",
    "EnvGroup",
    "Environment",
    "EnvironmentArgsError",
    "EnvironmentNotFound",
    "EpisodeError",
    "ErrorInfo",
    "EvalRun",
    "Example",
    "Final",
    "JudgeError",
    "JudgeRubric",
    "Message",
    "Messages",
    "ModelClient",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelResponse",
    "ModelTimeout",
    "ModelUnavailable",
    "MultiTurnEnv",
    "OpenAIClient",
    "Parser",
    "RLMEnv",
    "ReplEnv",
    "ReplLimits",
    "RewardError",
    "Rollout",
    "RolloutTimeout",
    "Rubric",
    "RubricGroup",
    "RunMetadata",
    "RunSpec",
    "Sampling",
    "SandboxUnavailable",
    "ScriptedClient",
    "SingleTurnEnv",
    "State",
    "StatefulToolEnv",
    "StreamingClient",
    "ThinkParser",
    "Timing",
    "Tool",
    "ToolArgumentError",
    "ToolDefinitionError",
    "ToolEnv",
    "TransientModelError",
    "Turn",
    "Usage",
    "XMLParser",
    "__version__",
    "content_text",
    "derive_seed",
    "evaluate",
    "group_reward",
    "installed_environments",
    "load_environment",
    "load_run",
    "stop",
]


def __getattr__(name: str) -> object:
    """``pa.LocalClient`` and ``pa.MCPEnv`` are imported on first use: they need extras (``local``:
    torch and transformers; ``mcp``: the MCP SDK, imported only when an ``MCPEnv`` is built);
    ``pa.RemoteEnvironment`` too, so that ``import palaestra`` stays light."""
    if name in ("LocalClient", "LocalStats"):
        from palaestra.clients import local

        return getattr(local, name)
    if name in ("MCPEnv", "MCPServer", "MCPConnectionError", "MCPToolError"):
        from palaestra.envs import mcp

        return getattr(mcp, name)
    if name in ("RemoteEnvironment", "RemoteEnvironmentError"):
        from palaestra.interop import remote

        return getattr(remote, name)
    raise AttributeError(f"module 'palaestra' has no attribute {name!r}")

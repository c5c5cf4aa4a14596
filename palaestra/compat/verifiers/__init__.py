"""A drop-in for Prime Intellect's ``verifiers`` 0.1.x API, so its environment packages run on palaestra.

``import palaestra.compat.verifiers as vf`` gives the namespace ``import verifiers as vf`` gives a
package written for verifiers 0.1.9 (and the 0.1.0-0.1.7 dialect: ``is_completed(messages,
state)``, tuple ``env_response``). ``install()`` registers it as ``verifiers`` (unless a real one is
importable), so such packages load unchanged: ``palaestra eval NAME`` through
``loading.load_verifiers_environment``. Its environments are palaestra environments. What is and
is not supported: docs/verifiers-compat.md.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from palaestra.compat.verifiers.decorators import cleanup, stop, teardown
from palaestra.compat.verifiers.envs import (
    EnvGroup,
    Environment,
    MultiTurnEnv,
    SingleTurnEnv,
    StatefulToolEnv,
    ToolEnv,
)
from palaestra.compat.verifiers.errors import (
    EmptyModelResponseError,
    Error,
    InfraError,
    ModelError,
    OverlongPromptError,
    SandboxError,
    ToolCallError,
    ToolError,
    ToolParseError,
)
from palaestra.compat.verifiers.loading import install, load_environment, load_verifiers_environment
from palaestra.compat.verifiers.parsers import MaybeThinkParser, Parser, ThinkParser, XMLParser
from palaestra.compat.verifiers.rubrics import JudgeRubric, Rubric, RubricGroup
from palaestra.compat.verifiers.types import (
    ChatCompletion,
    ChatCompletionMessageToolCall,
    ChatCompletionToolParam,
    ChatMessage,
    ChatMessages,
    GroupRewardFunc,
    IndividualRewardFunc,
    Info,
    Message,
    Messages,
    MessageType,
    ModelResponse,
    RewardFunc,
    RolloutInput,
    RolloutScore,
    RolloutScores,
    RolloutTiming,
    SamplingArgs,
    State,
    TrajectoryStep,
    TrajectoryStepTokens,
)
from palaestra.compat.verifiers.utils.data_utils import (
    extract_boxed_answer,
    extract_hash_answer,
    load_example_dataset,
)

__version__ = "0.1.9"

# verifiers' optional parts: what each needs here
_NOT_SUPPORTED = {
    "TextArenaEnv": "needs the textarena integration, which palaestra does not provide",
    "ReasoningGymEnv": "needs the reasoning-gym integration, which palaestra does not provide",
    "SandboxEnv": "needs Prime Intellect's sandboxes, which palaestra does not provide",
    "PythonEnv": "needs Prime Intellect's sandboxes, which palaestra does not provide",
    "GymEnv": "is experimental in verifiers and not provided",
    "CliAgentEnv": "is experimental in verifiers and not provided",
    "HarborEnv": "is experimental in verifiers and not provided",
    "MCPEnv": "is not provided: use palaestra's own pa.MCPEnv",
    "RLTrainer": "is verifiers' trainer: train with `palaestra train` instead",
    "RLConfig": "is verifiers' trainer: train with `palaestra train` instead",
    "GRPOTrainer": "is verifiers' trainer: train with `palaestra train` instead",
    "GRPOConfig": "is verifiers' trainer: train with `palaestra train` instead",
    "grpo_defaults": "is verifiers' trainer: train with `palaestra train` instead",
    "lora_defaults": "is verifiers' trainer: train with `palaestra train` instead",
    "get_model": "is verifiers' trainer: train with `palaestra train` instead",
    "get_model_and_tokenizer": "is verifiers' trainer: train with `palaestra train` instead",
}


def setup_logging(level: str = "INFO", log_format: str | None = None, date_format: str | None = None) -> None:
    """Log this layer's messages (verifiers' loggers) to stderr at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            log_format or "%(asctime)s - %(name)s - %(levelname)s - %(message)s",
            date_format or "%Y-%m-%d %H:%M:%S",
        )
    )
    logger = logging.getLogger(__name__)
    logger.handlers.clear()
    logger.setLevel(level.upper())
    logger.addHandler(handler)
    logger.propagate = False


def print_prompt_completions_sample(
    prompts: Any, completions: Any, rewards: Any, step: int = 0, **kwargs: Any
) -> None:
    """Print (prompt, completion, reward) triples, plainly."""
    print(f"step {step}")
    for prompt, completion, reward in zip(prompts, completions, rewards, strict=False):
        print(f"--- reward {reward}\n{prompt}\n>>> {completion}")


def __getattr__(name: str) -> Any:
    """``vf.MathRubric`` is imported on first use (it needs math-verify); other optional parts say why not."""
    if name == "MathRubric":
        from palaestra.compat.verifiers.rubrics.math_rubric import MathRubric

        return MathRubric
    if name in _NOT_SUPPORTED:
        raise AttributeError(
            f"verifiers.{name} {_NOT_SUPPORTED[name]} (palaestra's verifiers compatibility layer)"
        )
    raise AttributeError(f"module 'verifiers' has no attribute {name!r}")


__all__ = [
    "ChatCompletion",
    "ChatCompletionMessageToolCall",
    "ChatCompletionToolParam",
    "ChatMessage",
    "ChatMessages",
    "EmptyModelResponseError",
    "EnvGroup",
    "Environment",
    "Error",
    "GroupRewardFunc",
    "IndividualRewardFunc",
    "Info",
    "InfraError",
    "JudgeRubric",
    "MaybeThinkParser",
    "Message",
    "MessageType",
    "Messages",
    "ModelError",
    "ModelResponse",
    "MultiTurnEnv",
    "OverlongPromptError",
    "Parser",
    "RewardFunc",
    "RolloutInput",
    "RolloutScore",
    "RolloutScores",
    "RolloutTiming",
    "Rubric",
    "RubricGroup",
    "SamplingArgs",
    "SandboxError",
    "SingleTurnEnv",
    "State",
    "StatefulToolEnv",
    "ThinkParser",
    "ToolCallError",
    "ToolEnv",
    "ToolError",
    "ToolParseError",
    "TrajectoryStep",
    "TrajectoryStepTokens",
    "XMLParser",
    "cleanup",
    "extract_boxed_answer",
    "extract_hash_answer",
    "install",
    "load_environment",
    "load_example_dataset",
    "load_verifiers_environment",
    "print_prompt_completions_sample",
    "setup_logging",
    "stop",
    "teardown",
]

"""verifiers' types (0.1.9 ``verifiers/types.py``): message aliases, the rollout ``State`` and TypedDicts.

Messages are plain OpenAI chat dicts, as in verifiers up to 0.1.10. ``State`` is verifiers' dict
that forwards ``prompt``, ``answer``, ``task``, ``info`` and ``example_id`` to ``state["input"]``
(the dataset row) when the row has them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from openai.types.chat.chat_completion import ChatCompletion
from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall
from openai.types.chat.chat_completion_role import ChatCompletionRole
from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
from openai.types.completion import Completion
from openai.types.shared_params import FunctionDefinition, FunctionParameters

from palaestra.compat.verifiers.errors import Error

ChatMessage = ChatCompletionMessageParam
MessageType = Literal["chat", "completion"]
ModelResponse = Completion | ChatCompletion | None
ChatMessages = list[ChatMessage]
Message = str | ChatMessage
Messages = str | list[ChatMessage]
Info = dict[str, Any]
SamplingArgs = dict[str, Any]
IndividualRewardFunc = Any  # Callable[..., float | Awaitable[float]]
GroupRewardFunc = Any  # Callable[..., list[float] | Awaitable[list[float]]]
RewardFunc = Any  # either of the above
JsonPrimitive = Literal["string", "number", "integer", "boolean", "array", "object"]


class TrajectoryStepTokens(TypedDict):
    prompt_ids: list[int]
    prompt_mask: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    overlong_prompt: bool
    is_truncated: bool


class TrajectoryStep(TypedDict):
    prompt: Messages
    completion: Messages
    response: ModelResponse
    tokens: TrajectoryStepTokens | None
    reward: float | None
    advantage: float | None
    is_truncated: bool
    trajectory_id: str
    extras: dict[str, Any]


class BaseRolloutInput(TypedDict):
    prompt: Messages
    example_id: int
    task: str


class RolloutInput(BaseRolloutInput, total=False):
    answer: str
    info: Info


class RolloutTiming(TypedDict, total=False):
    start_time: float
    generation_ms: float
    scoring_ms: float
    total_ms: float


class RolloutScore(TypedDict):
    reward: float
    metrics: dict[str, float]


class RolloutScores(TypedDict):
    reward: list[float]
    metrics: dict[str, list[float]]


class State(dict[str, Any]):
    """A rollout's state; the input fields read and write through ``state["input"]`` when present there."""

    INPUT_FIELDS = ("prompt", "answer", "task", "info", "example_id")

    def __getitem__(self, key: str) -> Any:
        if key in self.INPUT_FIELDS and dict.__contains__(self, "input"):
            row = dict.__getitem__(self, "input")
            if key in row:
                return row[key]
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self.INPUT_FIELDS and dict.__contains__(self, "input"):
            row = dict.__getitem__(self, "input")
            if key in row:
                row[key] = value
                return
        dict.__setitem__(self, key, value)

    def __contains__(self, key: object) -> bool:
        if key in self.INPUT_FIELDS and dict.__contains__(self, "input"):
            return key in dict.__getitem__(self, "input") or dict.__contains__(self, key)
        return dict.__contains__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


__all__ = [
    "BaseRolloutInput",
    "ChatCompletion",
    "ChatCompletionMessageToolCall",
    "ChatCompletionRole",
    "ChatCompletionToolParam",
    "ChatMessage",
    "ChatMessages",
    "Completion",
    "Error",
    "FunctionDefinition",
    "FunctionParameters",
    "GroupRewardFunc",
    "IndividualRewardFunc",
    "Info",
    "JsonPrimitive",
    "Message",
    "MessageType",
    "Messages",
    "ModelResponse",
    "RewardFunc",
    "RolloutInput",
    "RolloutScore",
    "RolloutScores",
    "RolloutTiming",
    "SamplingArgs",
    "State",
    "TrajectoryStep",
    "TrajectoryStepTokens",
]

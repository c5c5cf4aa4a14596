"""The records that flow through palaestra: messages, examples, model responses and rollouts.

Messages are plain OpenAI chat dicts (``role``, ``content``, ``tool_calls``, ``tool_call_id``) so
that any OpenAI-compatible server and any Hugging Face chat template take them unchanged.
Everything else is a dataclass that converts to and from JSON-ready dicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
Messages = list[Message]


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived from ``parts``: stable across processes and Python versions."""
    key = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True)
class Sampling:
    """Sampling arguments for one model request; ``None`` means "the server's default".

    ``extra`` is merged into the request body as-is (e.g. ``{"top_k": 20}`` for vLLM).
    ``seed`` is normally set per request by the engine from the run seed, so that a backend that
    honours it (vLLM, the local client, scripted clients) reproduces a run.
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> Sampling:
        return dataclasses.replace(self, **changes)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __iadd__(self, other: Usage) -> Usage:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        return self


@dataclass
class ModelResponse:
    """One assistant reply. ``token_ids``/``logprobs`` are the completion's, when the backend gives them;
    ``prompt_token_ids`` are the exact ids the reply was sampled after (the rendered prompt)."""

    message: Message
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None

    @property
    def content(self) -> str:
        return self.message.get("content") or ""


@dataclass
class ChatChunk:
    """A piece of a reply while it is generated (``chat_stream``): new text and the tokens behind it.

    ``text`` may be empty while a multi-token character or a possible stop string is held back.
    The last chunk carries the whole reply as ``response`` (its text is the join of every chunk's).
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    response: ModelResponse | None = None


@dataclass
class Example:
    """One dataset row made ready for a rollout.

    ``prompt`` is the full message list sent on the first turn (system prompt and few-shot
    included); ``row`` keeps every dataset column so reward functions can ask for any of them.
    """

    id: int
    prompt: Messages
    answer: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """One model turn of a rollout: what came back, and how long it took."""

    index: int
    prompt_messages: int  # how many messages preceded this reply
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    model_time: float = 0.0
    env_time: float = 0.0


@dataclass
class ErrorInfo:
    """Why a rollout failed. ``stage`` is where: ``model``, ``env``, ``timeout`` or ``scoring``."""

    type: str
    message: str
    stage: str

    @classmethod
    def from_exception(cls, exc: BaseException, stage: str) -> ErrorInfo:
        return cls(type=type(exc).__name__, message=str(exc) or repr(exc), stage=stage)


@dataclass
class Timing:
    model: float = 0.0
    env: float = 0.0
    scoring: float = 0.0
    total: float = 0.0


class State(dict[str, Any]):
    """Per-rollout state: a dict saved with the rollout, plus attributes that are not saved.

    ``rng`` is seeded from (run seed, example id, rollout index): use it, never global randomness.
    """

    rng: random.Random
    example: Example
    turn: int

    def __init__(self, example: Example, rng: random.Random) -> None:
        super().__init__()
        self.example = example
        self.rng = rng
        self.turn = 0


@dataclass
class Rollout:
    """One complete episode: the record eval saves, data generation filters and training consumes."""

    example_id: int
    rollout_index: int
    seed: int
    prompt: Messages
    completion: Messages = field(default_factory=list)
    answer: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: str | None = None
    error: ErrorInfo | None = None
    timing: Timing = field(default_factory=Timing)
    usage: Usage = field(default_factory=Usage)

    @property
    def messages(self) -> Messages:
        return self.prompt + self.completion

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; state values JSON cannot hold are stored as their ``repr``."""
        # user-owned values are kept out of asdict's deep copy, which fails on uncopyable objects
        state, info, answer = self.state, self.info, self.answer
        self.state, self.info, self.answer = {}, {}, None
        try:
            out = dataclasses.asdict(self)
        finally:
            self.state, self.info, self.answer = state, info, answer
        out["state"] = _jsonable(dict(state))
        out["info"] = _jsonable(info)
        out["answer"] = _jsonable(answer)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rollout:
        data = dict(data)
        data["turns"] = [Turn(**{**t, "usage": Usage(**t.get("usage", {}))}) for t in data.get("turns", [])]
        data["usage"] = Usage(**data.get("usage", {}))
        data["timing"] = Timing(**data.get("timing", {}))
        if data.get("error") is not None:
            data["error"] = ErrorInfo(**data["error"])
        return cls(**data)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    return repr(value)

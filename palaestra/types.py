"""The records that flow through palaestra: messages, examples, model responses and rollouts.

Messages are plain OpenAI chat dicts (``role``, ``content``, ``tool_calls``, ``tool_call_id``) so
that any OpenAI-compatible server and any Hugging Face chat template take them unchanged.
Everything else is a dataclass that converts to and from JSON-ready dicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any

from palaestra.rollout_json import check_rollout_dict, jsonable

Message = dict[str, Any]
Messages = list[Message]
SEED_RANGE = 2**63  # seeds are saved as JSON integers, which must fit a signed 64-bit int


def content_text(content: Any, *, placeholders: bool = False) -> str:
    """The text of a message's ``content``: a string as is, ``None`` as "", and for an OpenAI
    list of content parts the text parts joined (other parts left out, or with ``placeholders``
    shown as ``<type>``, e.g. ``<image_url>``). The one rule every part of palaestra reads text by."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif (
            isinstance(part, dict)
            and part.get("type", "text") == "text"
            and isinstance(part.get("text"), str)
        ):
            parts.append(part["text"])
        elif placeholders:
            kind = part.get("type", "part") if isinstance(part, dict) else type(part).__name__
            parts.append(f"<{kind}>")
    return "".join(parts)


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

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> ValueError:
            return ValueError(f"sampling {name} must be {what}, got {getattr(self, name)!r}")

        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or not 1 <= self.max_tokens < 2**31
        ):
            raise bad("max_tokens", "an integer in [1, 2**31)")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(name, "a finite number")
        if self.temperature is not None and self.temperature < 0:
            raise bad("temperature", ">= 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise bad("top_p", "in (0, 1]")
        if isinstance(self.stop, str):  # one stop string, as the OpenAI API also accepts
            object.__setattr__(self, "stop", [self.stop])
        if self.stop is not None and not (
            isinstance(self.stop, list) and all(isinstance(s, str) for s in self.stop)
        ):
            raise bad("stop", "a list of strings")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_RANGE
        ):
            raise bad("seed", "an integer in [0, 2**63)")
        if not isinstance(self.logprobs, bool):
            raise bad("logprobs", "true or false")
        if not isinstance(self.extra, dict):
            raise bad("extra", "a dict")

    def replace(self, **changes: Any) -> Sampling:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sampling:
        """The sampling saved by ``dataclasses.asdict``; ``ValueError`` for unknown keys."""
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown sampling keys: {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass(frozen=True)
class RunSpec:
    """What one run does: which examples, how many rollouts each, how many requests at once, seeds.

    The one description of a run that ``Environment.run``, ``evaluate``, the CLI and the trainers
    all take, and that a saved run keeps. ``num_examples`` is the first n examples (-1: all);
    ``sampling`` ``None`` means the environment's own. After ``max_failures_in_a_row`` model
    requests in a row fail (after the client's retries) the run stops with ``ModelUnavailable``
    rather than record an error for every remaining rollout (0: never stop).
    """

    num_examples: int = -1
    rollouts_per_example: int = 1
    max_concurrent: int = 32
    seed: int = 0
    sampling: Sampling | None = None
    max_failures_in_a_row: int = 20

    def __post_init__(self) -> None:
        counts = (
            ("num_examples", -1),
            ("rollouts_per_example", 1),
            ("max_concurrent", 1),
            ("max_failures_in_a_row", 0),
        )
        for name, low in counts:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")
        if self.num_examples == 0:
            raise ValueError("num_examples is 0: no examples to run (-1 runs them all)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_RANGE:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.sampling is not None and not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(self.sampling).__name__}")

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """The spec saved by ``to_dict``; ``ValueError`` for unknown keys or bad values."""
        data = dict(data)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown run spec keys: {', '.join(sorted(unknown))}")
        sampling = data.get("sampling")
        if isinstance(sampling, dict):
            data["sampling"] = Sampling.from_dict(sampling)
        return cls(**data)


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
    env: str | None = None  # in an EnvGroup: the name of the environment the row comes from


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
    ``resources`` holds what must not be saved (a database connection, a client session).
    """

    rng: random.Random
    example: Example
    turn: int
    resources: dict[str, Any]

    def __init__(self, example: Example, rng: random.Random) -> None:
        super().__init__()
        self.example = example
        self.rng = rng
        self.turn = 0
        self.resources = {}


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
    tools: list[dict[str, Any]] | None = None  # the tool schemas the model was given, if any
    env: str | None = None  # in an EnvGroup: the name of the environment that ran and scored it
    policy_version: int | None = None  # RL: how many updates the weights that sampled it had

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
        out["state"] = jsonable(dict(state))
        out["info"] = jsonable(info)
        out["answer"] = jsonable(answer)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Rollout:
        """Read ``to_dict``'s output back; ``ValueError``/``TypeError`` if ``data`` is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"a rollout must be a JSON object, not {type(data).__name__}")
        data = dict(data)
        check_rollout_dict(data)
        data["turns"] = [Turn(**{**t, "usage": Usage(**t.get("usage", {}))}) for t in data.get("turns", [])]
        data["usage"] = Usage(**data.get("usage", {}))
        data["timing"] = Timing(**data.get("timing", {}))
        if data.get("error") is not None:
            data["error"] = ErrorInfo(**data["error"])
        return cls(**data)

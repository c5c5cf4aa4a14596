"""A saved rollout's JSON: what ``Rollout.from_dict`` accepts, and how ``to_dict`` stores user values.

A run folder is data a user may have edited or another version wrote, so reading one checks every
field's type and names the first one that is wrong, instead of failing later inside training.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def check_rollout_dict(data: dict[str, Any]) -> None:
    """``ValueError`` naming the first field of a saved rollout that is unknown or of the wrong type."""
    _check(data, _ROLLOUT_FIELDS, "rollout")
    for i, turn in enumerate(data.get("turns", [])):
        _check(turn, _TURN_FIELDS, f"turns[{i}]")
        _check(turn.get("usage", {}), _USAGE_FIELDS, f"turns[{i}].usage")
    _check(data.get("usage", {}), _USAGE_FIELDS, "usage")
    _check(data.get("timing", {}), dict.fromkeys(("model", "env", "scoring", "total"), _NUMBER), "timing")
    if data.get("error") is not None:
        _check(data["error"], {"type": str, "message": str, "stage": str}, "error", required=True)
    if not all(isinstance(m, dict) for m in [*data.get("prompt", []), *data.get("completion", [])]):
        raise ValueError("messages must be JSON objects")
    if not all(v is None or _is_number(v) for v in data.get("metrics", {}).values()):
        raise ValueError("metrics must be numbers")


_NUMBER = (int, float)
_OPTIONAL = type(None)
_IDS = "ids"  # a list of integers, or null
_ROLLOUT_FIELDS: dict[str, Any] = {
    "example_id": int,
    "rollout_index": int,
    "seed": int,
    "prompt": list,
    "completion": list,
    "answer": object,
    "info": dict,
    "turns": list,
    "state": dict,
    "reward": (*_NUMBER, _OPTIONAL),
    "metrics": dict,
    "stop_reason": (str, _OPTIONAL),
    "error": (dict, _OPTIONAL),
    "timing": dict,
    "usage": dict,
    "tools": (list, _OPTIONAL),
    "env": (str, _OPTIONAL),
    "policy_version": (int, _OPTIONAL),
}
_TURN_FIELDS: dict[str, Any] = {
    "index": int,
    "prompt_messages": int,
    "finish_reason": (str, _OPTIONAL),
    "usage": dict,
    "token_ids": _IDS,
    "logprobs": "numbers",
    "prompt_token_ids": _IDS,
    "model_time": _NUMBER,
    "env_time": _NUMBER,
}
_USAGE_FIELDS: dict[str, Any] = {"prompt_tokens": int, "completion_tokens": int}


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _check(data: Any, fields: dict[str, Any], where: str, *, required: bool = False) -> None:
    """``ValueError`` naming the first field of ``data`` that is unknown or of the wrong type."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object")
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"{where} has an unknown field {key!r:.50}")
        kind = fields[key]
        if kind == _IDS:
            ok = value is None or (
                isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            )
        elif kind == "numbers":
            ok = value is None or (isinstance(value, list) and all(_is_number(v) for v in value))
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == _NUMBER:
            ok = _is_number(value)
        elif kind == (*_NUMBER, _OPTIONAL):
            ok = value is None or _is_number(value)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ValueError(f"{where}.{key} has the wrong type: {value!r:.50}")
    if required and set(fields) - set(data):
        raise ValueError(f"{where} lacks {', '.join(sorted(set(fields) - set(data)))}")


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: containers walked, dataclasses as dicts, anything else its ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return repr(value)

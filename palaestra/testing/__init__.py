"""Test helpers shipped with palaestra: a fake OpenAI-compatible server for offline tests."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palaestra.testing.server import (
        FAULT_KINDS,
        FakeOpenAIServer,
        FaultPlan,
        Reply,
        ReplyFn,
        echo_reply,
        fixed_reply,
        reverse_reply,
        served_in_thread,
    )

__all__ = [
    "FAULT_KINDS",
    "FakeOpenAIServer",
    "FaultPlan",
    "Reply",
    "ReplyFn",
    "echo_reply",
    "fixed_reply",
    "reverse_reply",
    "served_in_thread",
]


def __getattr__(name: str) -> object:
    """Re-export lazily, so `python -m palaestra.testing.server` does not import it twice."""
    if name in __all__:
        from palaestra.testing import server

        return getattr(server, name)
    raise AttributeError(f"module 'palaestra.testing' has no attribute {name!r}")

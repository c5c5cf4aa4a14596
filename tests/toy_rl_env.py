"""The RL tests' toy environment, for the trainer's own process and for ranks that torchrun starts
(``distributed_toy_rl.py``): one-turn prompts rewarded by the share of ``a`` in the reply."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import palaestra as pa
from palaestra.registry import EnvironmentArgsError


def share_of_a(completion: list[dict[str, Any]]) -> float:
    text = str(completion[-1]["content"])
    return text.count("a") / max(len(text), 1)


def toy_env(num_examples: int = 8, seed: int = 0, kill_at: int = 0, pidfile: str = "") -> pa.Environment:
    """The ``kill_at``-th reward (counted by this environment) SIGKILLs the process whose pid is in
    ``pidfile``: a sampler server dying mid-step (a server already gone is left so)."""

    calls = [0]

    def reward(completion: list[dict[str, Any]]) -> float:
        calls[0] += 1
        if kill_at and calls[0] == kill_at:
            with contextlib.suppress(ProcessLookupError):  # another rank's environment was first
                os.kill(int(Path(pidfile).read_text()), signal.SIGKILL)
        return share_of_a(completion)

    rows = [{"question": f"say something {i + seed}"} for i in range(num_examples)]
    return pa.SingleTurnEnv(dataset=rows, rubric=pa.Rubric([reward]))


def load(name: str, **kwargs: Any) -> pa.Environment:
    """``load_environment`` for the trainer: ``toy`` and its arguments only."""
    unknown = sorted(set(kwargs) - {"num_examples", "seed", "kill_at", "pidfile"})
    if name != "toy" or unknown:
        raise EnvironmentArgsError(f"environment {name!r} does not take {unknown}")
    return toy_env(**kwargs)


def install() -> None:
    """Ray's ``worker_process_setup_hook`` for the tests' cluster: ``toy`` loads by name in its
    workers too, as an installed environment would."""
    from palaestra import registry

    real = registry.load_environment

    def load_here(name: str, **kwargs: Any) -> pa.Environment:
        return load(name, **kwargs) if name == "toy" else real(name, **kwargs)

    registry.load_environment = load_here

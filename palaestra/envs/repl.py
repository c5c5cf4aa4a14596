"""ReplEnv: the model runs Python through a ``python(code)`` tool, in a sandboxed REPL of its own.

Each rollout gets its own worker process (started on its first call, so state persists across
calls: variables, imports, files in its working directory), inside the sandbox of
``palaestra.sandbox``: bubblewrap namespaces plus rlimits, or rlimits alone when the environment
is built with ``sandbox="rlimits"``. The model reads stdout, stderr, the value of the last
expression and the exception, each cut to ``limits.output_chars`` characters with a line saying
what was cut. A call past a limit (``ReplLimits``) is killed and reported as an error; the next
call starts a new worker, and the model is told its state was lost. The worker is killed in
``cleanup_state``, however the rollout ended. Building the environment checks that the sandbox
works here and raises ``SandboxUnavailable`` if not.

Metrics, per rollout: ``repl_calls``, ``repl_errors``, ``repl_kills`` (calls stopped by a limit),
``repl_restarts``, ``repl_seconds`` and ``repl_cpu_seconds``, beside the tool metrics.
"""

from __future__ import annotations

from typing import Any

from palaestra.clients.base import ModelClient
from palaestra.envs.tool import StatefulToolEnv
from palaestra.repl import ReplSession, WorkerStartError
from palaestra.sandbox import ReplLimits, Sandbox
from palaestra.types import Rollout, Sampling, State

REPL_STATS = ("repl_calls", "repl_errors", "repl_kills", "repl_restarts", "repl_seconds", "repl_cpu_seconds")


async def python(code: str, repl: ReplSession) -> str:
    """Run Python code in your own persistent interpreter: variables and imports stay between calls.

    You see what it prints (stdout and stderr), the value of its last expression and any exception.

    Args:
        code: Python statements to run; a last expression's value is shown.
    """
    return await repl.run(code)


class ReplEnv(StatefulToolEnv):
    """A ``StatefulToolEnv`` whose tool is a sandboxed Python REPL per rollout.

    ``limits`` (a ``ReplLimits`` or a dict of its fields) bound each call and each rollout;
    ``sandbox`` is ``"bubblewrap"`` or, asked for by name, the weaker ``"rlimits"`` (named in each
    run's metadata and summary). A worker that cannot start mid-run ends the rollout (stage
    ``tool``). Other keyword arguments are ``StatefulToolEnv``'s.
    """

    def __init__(
        self,
        *,
        limits: ReplLimits | dict[str, Any] | None = None,
        sandbox: str = "bubblewrap",
        max_turns: int = 10,
        **kwargs: Any,
    ) -> None:
        self.limits = ReplLimits() if limits is None else ReplLimits.from_dict(limits)
        self.sandbox = Sandbox(sandbox)
        self.sandbox.check()  # refuse to start where the sandbox cannot
        kwargs["fatal_errors"] = (*kwargs.get("fatal_errors", ()), WorkerStartError)
        super().__init__(max_turns=max_turns, **kwargs)
        self.add_tool(python, hidden=["repl"], timeout=None)  # the session bounds every call itself

    def make_session(self, state: State) -> ReplSession:
        """The REPL of one rollout (``RLMEnv`` adds its context and its sub-model socket)."""
        return ReplSession(self.sandbox, self.limits)

    async def setup_state(self, state: State) -> None:
        state.resources["repl"] = self.make_session(state)

    async def cleanup_state(self, state: State) -> None:
        repl = state.resources.pop("repl", None)
        if repl is not None:
            await repl.aclose()
            state["repl_stats"] = dict(repl.stats)

    def metric_names(self) -> list[str]:
        return sorted({*super().metric_names(), *REPL_STATS})

    def run_notes(self) -> dict[str, str]:
        note = self.sandbox.note
        return {"sandbox": note} if note else {}

    async def episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        try:
            await super().episode(client, rollout, state, sampling)
        finally:  # the worker's counters, also for a rollout that failed or was cut short
            stats = state.get("repl_stats") or {}
            rollout.metrics.update({name: float(stats.get(name, 0)) for name in REPL_STATS})

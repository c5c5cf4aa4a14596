"""RLMEnv: a recursive language model, whose long context lives in the REPL, not in the prompt.

Each example's ``context`` column (a string, or a list of strings) is bound to the variable
``context`` in the rollout's sandboxed REPL (``ReplEnv``); the prompt only says its type and size.
The model reads it with code and with sub-calls to a model from inside the REPL:
``llm_query(prompt)`` and ``llm_query_batched(prompts)`` send prompts over a Unix socket that
is bound into the sandbox (nothing else of the host is reachable), and the environment answers
them with ``sub_client`` (by default the rollout's own client, with the engine's limits) as
plain one-message chats. With ``max_depth`` above 1, a sub-call is itself an RLM rollout (the
prompt becomes its ``context``, in a REPL of its own, and its ``FINAL`` answer is the reply), down
to ``max_depth`` levels, the last of which are plain chats. A root rollout and everything below
it may make ``max_sub_calls`` sub-calls, at most ``max_batch`` at once, each prompt at most
``max_prompt_chars`` long; past a limit ``llm_query`` raises, and the model reads why.

The final answer is ``FINAL(answer)`` called in the REPL, or ``FINAL(answer)`` written in a
reply without tool calls; it is ``state["final_answer"]``. Sub-calls' tokens count in the
rollout's ``usage`` (and in the ``sub_*`` metrics; a nested rollout's own turns too), but they
are not the rollout's messages, so SFT and RL train on the root model's turns only, never on
what a sub-model wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import tempfile
from typing import Any

from palaestra.clients.base import ModelClient, ModelError
from palaestra.envs.base import DatasetError
from palaestra.envs.multiturn import stop
from palaestra.envs.repl import ReplEnv
from palaestra.repl import PythonWorker, ReplSession
from palaestra.sandbox import ReplLimits
from palaestra.types import Example, Messages, Rollout, Sampling, State, Usage, content_text, derive_seed

FINAL_TAG = re.compile(r"FINAL\((.*)\)", re.DOTALL)
REQUEST_BYTES = 16 * 2**20  # the longest request line a worker may send
SUB_STATS = ("sub_calls", "sub_errors", "sub_prompt_tokens", "sub_completion_tokens")
RLM_SYSTEM_PROMPT = (
    "You answer a question about a context that is too long to read here. It is in the variable "
    "`context` of your Python REPL: call the python tool to inspect it with code. Inside the REPL, "
    "llm_query(prompt) asks a language model and returns its reply, and llm_query_batched(prompts) "
    "asks several at once. When you know the answer, call FINAL(answer) in the REPL."
)
SUB_TASK = "Answer the request that is the variable `context`, and give your answer with FINAL(answer)."


class SubCallFailed(Exception):
    """A nested RLM rollout (``max_depth`` above 1) failed; the model reads why."""


def describe_context(context: Any) -> str:
    """What the model is told about a context: its type and size, never its content."""
    if isinstance(context, str):
        return f"`context` is a str of {len(context):,} characters."
    total = sum(len(c) for c in context)
    return f"`context` is a list of {len(context):,} str ({total:,} characters in all)."


class RLMEnv(ReplEnv):
    """A ``ReplEnv`` whose rows carry a long ``context`` that the model reaches only from the REPL.

    ``sub_client`` answers ``llm_query`` (None: the rollout's own client); ``sub_sampling`` is
    its sampling (None: the environment's, each sub-call seeded from the rollout's seed).
    ``max_depth`` is how many levels of RLM rollouts a sub-call may open (1: sub-calls are
    plain chats). ``context_column`` names the dataset column. ``limits`` default to 60 s per call, since a
    call's wall time includes its sub-calls. Other keyword arguments are ``ReplEnv``'s.
    """

    def __init__(
        self,
        *,
        sub_client: ModelClient | None = None,
        sub_sampling: Sampling | None = None,
        max_sub_calls: int = 32,
        max_batch: int = 8,
        max_prompt_chars: int = 32_000,
        max_depth: int = 1,
        context_column: str = "context",
        limits: ReplLimits | dict[str, Any] | None = None,
        system_prompt: str | None = RLM_SYSTEM_PROMPT,
        **kwargs: Any,
    ) -> None:
        for name, value in (
            ("max_sub_calls", max_sub_calls),
            ("max_batch", max_batch),
            ("max_prompt_chars", max_prompt_chars),
            ("max_depth", max_depth),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
        self.sub_client = sub_client
        self.sub_sampling = sub_sampling
        self.max_sub_calls, self.max_batch, self.max_prompt_chars = max_sub_calls, max_batch, max_prompt_chars
        self.max_depth = max_depth
        self._roots: dict[str, State] = {}  # the root rollout's state of each nested rollout running
        self.context_column = context_column
        if limits is None:
            limits = ReplLimits(call_seconds=60.0, rollout_seconds=300.0)
        super().__init__(limits=limits, system_prompt=system_prompt, **kwargs)

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        """The row's prompt with a line about its context; the context itself stays in the row."""
        context = row.get(self.context_column)
        if not (
            isinstance(context, str)
            or (isinstance(context, list) and all(isinstance(c, str) for c in context))
        ):
            raise DatasetError(f"row {index}: {self.context_column!r} must be a string or a list of strings")
        example = super().make_example(index, row)
        last = example.prompt[-1]
        last["content"] = f"{content_text(last.get('content'))}\n\n{describe_context(context)}"
        return example

    def make_session(self, state: State) -> ReplSession:
        context = state.example.row[self.context_column]

        async def put_context(worker: PythonWorker) -> None:
            await worker.request({"op": "set", "name": "context", "value": context})

        return ReplSession(self.sandbox, self.limits, rlm=True, on_start=put_context)

    async def setup_state(self, state: State) -> None:
        await super().setup_state(state)
        for name in SUB_STATS:
            state[name] = 0
        folder = tempfile.mkdtemp(prefix="palaestra-rlm-")  # 0700: only this user reaches the socket
        state.resources["socket_dir"] = folder
        path = os.path.join(folder, "llm.sock")
        tasks: set[asyncio.Task[Any]] = set()
        state.resources["sub_tasks"] = tasks

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                reply = await self._answer(reader, state)
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass  # the worker went away (killed by a limit): nobody to answer
            finally:
                tasks.discard(task)
                writer.close()

        state.resources["socket_server"] = await asyncio.start_unix_server(serve, path, limit=REQUEST_BYTES)
        os.chmod(path, 0o666)  # a worker of another user id (under root) may connect; the folder guards it
        state.resources["repl"].sockets = {"llm": path}

    async def cleanup_state(self, state: State) -> None:
        try:
            await super().cleanup_state(state)
        finally:
            server = state.resources.pop("socket_server", None)
            if server is not None:
                server.close()
            for task in list(state.resources.pop("sub_tasks", ())):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            folder = state.resources.pop("socket_dir", None)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    async def _answer(self, reader: asyncio.StreamReader, state: State) -> dict[str, Any]:
        """Answer one ``llm_query_batched`` request from the worker, within the rollout's limits."""
        try:
            request = json.loads(await reader.readline())
        except (ValueError, asyncio.LimitOverrunError):
            return {"error": f"llm_query: the request is not JSON or longer than {REQUEST_BYTES:,} bytes"}
        prompts = request.get("prompts") if isinstance(request, dict) else None
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            return {"error": "llm_query: the prompts must be a non-empty list of strings"}
        if len(prompts) > self.max_batch:
            return {
                "error": f"llm_query_batched: at most {self.max_batch} prompts at once, not {len(prompts)}"
            }
        long = max(len(p) for p in prompts)
        if long > self.max_prompt_chars:
            return {
                "error": f"llm_query: a prompt may hold {self.max_prompt_chars:,} characters; one has {long:,}"
            }
        root = self._roots.get(state.example.info.get("rlm_root", ""), state)  # the budget is the root's
        left = self.max_sub_calls - root["sub_calls"]
        if len(prompts) > left:
            root["sub_errors"] += 1
            return {
                "error": f"llm_query: this rollout may make {self.max_sub_calls} sub-calls and has {left} left"
            }
        first = root["sub_calls"]
        root["sub_calls"] += len(prompts)
        try:
            answers = await asyncio.gather(
                *(self._sub_call(p, first + i, state) for i, p in enumerate(prompts))
            )
        except (ModelError, SubCallFailed) as exc:
            root["sub_errors"] += 1
            return {"error": f"llm_query: the sub-model failed: {type(exc).__name__}: {exc}"}
        return {"answers": answers}

    async def _sub_call(self, prompt: str, index: int, state: State) -> str:
        rollout: Rollout = state.resources["rollout"]
        client: ModelClient = self.sub_client or state.resources["client"]
        sampling = (self.sub_sampling or state.resources["sampling"]).replace(
            seed=derive_seed(rollout.seed, "sub", index)
        )
        depth = int(state.example.info.get("rlm_depth", 0)) + 1  # of the model this call asks
        if depth < self.max_depth:
            reply, usage = await self._nested(prompt, index, depth, client, sampling, state)
        else:
            response = await client.chat([{"role": "user", "content": prompt}], sampling=sampling)
            reply, usage = response.content, response.usage
        rollout.usage += usage
        state["sub_prompt_tokens"] += usage.prompt_tokens
        state["sub_completion_tokens"] += usage.completion_tokens
        return reply

    async def _nested(
        self, prompt: str, index: int, depth: int, client: ModelClient, sampling: Sampling, state: State
    ) -> tuple[str, Usage]:
        """A sub-call as an RLM rollout of its own, whose context is ``prompt``: its reply and usage."""
        token = secrets.token_hex(8)
        self._roots[token] = self._roots.get(state.example.info.get("rlm_root", ""), state)
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        example = Example(
            id=state.example.id,
            prompt=[*head, {"role": "user", "content": f"{SUB_TASK}\n\n{describe_context(prompt)}"}],
            info={"rlm_depth": depth, "rlm_root": token},
            row={self.context_column: prompt},
        )
        try:
            child = await self.rollout(client, example, seed=sampling.seed or 0, sampling=sampling)
        finally:
            del self._roots[token]
        if child.error is not None:
            raise SubCallFailed(
                f"the rollout at depth {depth} failed: {child.error.type}: {child.error.message}"
            )
        final = child.state.get("final_answer")
        if final is None:
            final = next(
                (
                    content_text(m.get("content"))
                    for m in reversed(child.completion)
                    if m["role"] == "assistant"
                ),
                "",
            )
        return str(final), child.usage

    @stop(priority=10)
    def final_answer(self, messages: Messages, state: State) -> bool:
        """``FINAL(answer)`` was called in the REPL, or written in a reply without tool calls."""
        repl = state.resources.get("repl")
        if repl is not None and repl.final is not None:
            state["final_answer"] = repl.final
            return True
        last = messages[-1] if messages else {}
        if last.get("role") == "assistant" and not last.get("tool_calls"):
            found = FINAL_TAG.search(content_text(last.get("content")))
            if found:
                state["final_answer"] = found.group(1).strip()
                return True
        return False

    def metric_names(self) -> list[str]:
        return sorted({*super().metric_names(), *SUB_STATS})

    async def episode(self, client: ModelClient, rollout: Rollout, state: State, sampling: Sampling) -> None:
        state.resources.update(rollout=rollout, client=client, sampling=sampling)
        try:
            await super().episode(client, rollout, state, sampling)
        finally:
            rollout.metrics.update({name: float(state.get(name, 0)) for name in SUB_STATS})

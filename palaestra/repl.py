"""One rollout's Python REPL: a sandboxed worker process, its limits, and what the model reads.

``ReplSession`` starts its worker (``palaestra/repl_worker.py`` inside a ``Sandbox``) on the
first call and keeps it, so variables and imports persist across calls. A call that runs past
its wall time is killed by the session; one past its CPU time is killed by the kernel (its
rlimit); a worker that exits or breaks the protocol is gone as well. Each of these is an error
the model reads, and the next call starts a new worker, with the model's state lost and said so.
``aclose`` kills the worker whatever state it is in, and the sandbox takes every process it
started with it (bubblewrap's PID namespace ends with its first process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from palaestra.sandbox import ReplLimits, Sandbox

WORKER_SOURCE = (Path(__file__).parent / "repl_worker.py").read_text(encoding="utf-8")
START_SECONDS = 30.0  # for a worker to start and say it is ready
REPLY_BYTES = 4 * 2**20  # the longest reply line read from a worker: honest ones are far shorter
LOST = "Its state is lost: the next call starts a new worker."
NEW = "A new worker: variables, imports and files of earlier calls are gone."
_live: weakref.WeakSet[PythonWorker] = weakref.WeakSet()


class WorkerStartError(RuntimeError):
    """A worker did not start (the sandbox broke since it was checked): the rollout ends, stage ``tool``."""


def live_workers() -> int:
    """How many worker processes of this process are running now (0 between runs)."""
    return sum(1 for w in _live if w.alive)


class PythonWorker:
    """One worker process; ``request`` sends a JSON request and waits for its reply."""

    def __init__(self, process: asyncio.subprocess.Process, workdir: str | None, sandbox: Sandbox) -> None:
        self.process = process
        self.workdir = workdir
        self.sandbox = sandbox
        _live.add(self)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    @classmethod
    async def start(
        cls, sandbox: Sandbox, limits: ReplLimits, *, cpu_seconds: int, rlm: bool, sockets: dict[str, str]
    ) -> PythonWorker:
        workdir = sandbox.make_workdir()
        config = {
            "output_chars": limits.output_chars,
            "memory_mb": limits.memory_mb,
            "disk_mb": limits.disk_mb,
            "max_processes": limits.max_processes,
            "cpu_seconds": cpu_seconds,
            "rlm": rlm,
            "tmp": workdir or "/tmp",
            "parent": os.getpid() if sandbox.mode == "rlimits" else None,
        }
        inside = [sandbox.python, "-I", "-S", "-B", "-c", WORKER_SOURCE, json.dumps(config)]
        argv, options = sandbox.command(inside, workdir=workdir, sockets=sockets, disk_mb=limits.disk_mb)
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=REPLY_BYTES,
                **options,
            )
        )
        try:  # shielded: a rollout cancelled now must not leave a half-started sandbox behind
            process = await asyncio.shield(spawn)
        except OSError as exc:
            sandbox.remove_workdir(workdir)
            raise WorkerStartError(f"the Python worker did not start: {exc}") from None
        except asyncio.CancelledError:
            spawn.add_done_callback(lambda done: _kill_later(done, workdir, sandbox))
            raise
        worker = cls(process, workdir, sandbox)
        try:
            async with asyncio.timeout(START_SECONDS):
                ready = await worker.read()
        except BaseException:
            await worker.kill()
            raise
        if ready is None or not ready.get("ready"):
            said = b""
            with contextlib.suppress(Exception):
                said = await asyncio.wait_for(process.stderr.read(2000), 1) if process.stderr else b""
            await worker.kill()
            line = (said.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            raise WorkerStartError(f"the Python worker did not start ({line})")
        return worker

    async def read(self) -> dict[str, Any] | None:
        """The next reply, or None if the worker is gone or sent something that is not one."""
        assert self.process.stdout is not None
        try:
            line = await self.process.stdout.readline()
            reply = json.loads(line) if line else None
        except (ValueError, asyncio.LimitOverrunError):  # too long, or not JSON: a broken worker
            return None
        return reply if isinstance(reply, dict) else None

    async def request(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send ``request``; its reply, or None when the worker is gone (it may also be cut by a timeout)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            await self.process.stdin.drain()
        except (ConnectionError, RuntimeError):
            return None
        return await self.read()

    async def kill(self) -> None:
        """Kill the worker and everything in its sandbox, and reap it; safe to call twice.

        The process started is stopped first, so that it cannot start another while its children
        are killed: bubblewrap's child is the init of the sandbox's PID namespace, and every
        process in the sandbox dies with it (a root-run bubblewrap does not always take it along
        when only the outer process dies)."""
        if self.process.returncode is None:
            kill_tree(self.process.pid)
        with contextlib.suppress(TimeoutError):  # reaped elsewhere, asyncio may not hear of it
            await asyncio.shield(asyncio.wait_for(self.process.wait(), 10))
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.sandbox.remove_workdir(self.workdir)
        self.workdir = None

    def death(self) -> str:
        """Why the worker is gone, from its exit status, in words for the model."""
        code = self.process.returncode
        signum = -code if code is not None and code < 0 else (code - 128 if code and code > 128 else None)
        if signum == signal.SIGXCPU:
            return "it used up its CPU time"
        if signum == signal.SIGKILL:
            return "it was killed (its CPU time for this rollout ran out, or the system killed it)"
        if signum is not None:
            return f"it was killed by signal {signum} ({signal.Signals(signum).name})"
        return f"it exited with status {code}"


class ReplSession:
    """The REPL of one rollout: ``run(code)`` returns what the model reads; ``aclose`` ends it.

    ``on_start(worker)`` runs after each worker starts (an RLM puts its context there again).
    ``stats`` counts calls, errors, kills, restarts, seconds and CPU seconds.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        limits: ReplLimits,
        *,
        rlm: bool = False,
        sockets: dict[str, str] | None = None,
        on_start: Callable[[PythonWorker], Awaitable[None]] | None = None,
    ) -> None:
        self.sandbox, self.limits, self.rlm = sandbox, limits, rlm
        self.sockets = sockets or {}
        self.on_start = on_start
        self.worker: PythonWorker | None = None
        self.final: str | None = None
        self.lost = False  # a worker was lost since the model last heard of it
        self.closed = False
        self._lock = asyncio.Lock()
        self._cpu_done = 0.0  # CPU seconds of workers that are gone
        self.stats = {
            "repl_calls": 0,
            "repl_errors": 0,
            "repl_kills": 0,
            "repl_restarts": 0,
            "repl_seconds": 0.0,
            "repl_cpu_seconds": 0.0,
        }

    def _cpu_left(self) -> int:
        return int(self.limits.rollout_cpu_seconds - self.stats["repl_cpu_seconds"])

    async def _worker(self) -> PythonWorker:
        if self.worker is not None and self.worker.alive:
            return self.worker
        if self.worker is not None:
            self.stats["repl_restarts"] += 1
        self.worker = await PythonWorker.start(
            self.sandbox,
            self.limits,
            cpu_seconds=max(self._cpu_left(), 1),
            rlm=self.rlm,
            sockets=self.sockets,
        )
        if self.closed:  # closed while it started: it must not outlive the session
            await self.worker.kill()
            raise RuntimeError("the REPL of this rollout is closed")
        if self.on_start is not None:
            await self.on_start(self.worker)
        return self.worker

    async def run(self, code: str) -> str:
        """Run ``code``; the text for the model (an ``Error: ...`` when a limit stopped it)."""
        return (await self.execute(code))[1]

    async def execute(self, code: str) -> tuple[dict[str, Any] | None, str]:
        """Run ``code``: the worker's reply (None when a limit stopped the call) and the model's text.

        A checker reads the reply (``value`` is the ``repr`` of the last expression)."""
        async with self._lock:
            return await self._run(code)

    async def _run(self, code: str) -> tuple[dict[str, Any] | None, str]:
        limits, stats = self.limits, self.stats
        stats["repl_calls"] += 1
        if self.closed:
            raise RuntimeError("the REPL of this rollout is closed")
        seconds_left = limits.rollout_seconds - stats["repl_seconds"]
        if seconds_left <= 0 or self._cpu_left() < 1:
            stats["repl_errors"] += 1
            used = "wall time" if seconds_left <= 0 else "CPU time"
            return None, f"Error: this rollout has used all its {used} for code; no more code runs."
        timeout = min(limits.call_seconds, seconds_left)
        worker = await self._worker()
        notice = f"[{NEW}]\n" if self.lost else ""
        self.lost = False
        start = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                reply = await worker.request(
                    {"op": "run", "code": code, "cpu": min(limits.call_cpu_seconds, self._cpu_left())}
                )
        except TimeoutError:
            reply, why = None, f"the call ran past its {round(timeout, 1):g} s of wall time and was killed"
        except BaseException:  # cancelled mid-call: the worker's state is unknown, so it goes
            await self._lose(worker, time.perf_counter() - start)
            raise
        else:
            why = ""
        elapsed = time.perf_counter() - start
        stats["repl_seconds"] += elapsed
        if reply is None:
            if not why:
                await worker.kill()  # reaped, so its exit status says why
                why = f"the worker died ({worker.death()})"
            await self._lose(worker, elapsed)
            stats["repl_errors"] += 1
            return None, f"{notice}Error: {why}. {LOST}"
        stats["repl_cpu_seconds"] = self._cpu_done + float(reply.get("cpu") or 0.0)
        if isinstance(reply.get("final"), str):
            self.final = reply["final"]
        if reply.get("error"):
            stats["repl_errors"] += 1
        text = notice + render(reply, limits.output_chars)
        if reply.get("restart"):
            await self._lose(worker, 0.0)
            text += f"\n[The call ran out of memory (the limit is {limits.memory_mb} MB). {LOST}]"
        return reply, text

    async def _lose(self, worker: PythonWorker, elapsed: float) -> None:
        """Kill ``worker``; its CPU time counts as at most ``elapsed`` more than it last said."""
        self.stats["repl_kills"] += 1
        await worker.kill()
        self._cpu_done = self.stats["repl_cpu_seconds"] = self.stats["repl_cpu_seconds"] + min(
            elapsed, self.limits.call_cpu_seconds
        )
        self.lost = True

    async def aclose(self) -> None:
        """Kill the worker, whatever it is doing; the session runs nothing more."""
        self.closed = True
        if self.worker is not None:
            await self.worker.kill()


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and its children (stopped first, so none is added)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    for child in _children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """The children of ``pid``, from ``/proc``."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


_background: set[asyncio.Task[None]] = set()


def _kill_later(
    spawn: asyncio.Future[asyncio.subprocess.Process], workdir: str | None, sandbox: Sandbox
) -> None:
    """Kill a worker whose start was cancelled, once its process exists."""
    if spawn.cancelled() or spawn.exception() is not None:
        sandbox.remove_workdir(workdir)
        return
    task = asyncio.ensure_future(PythonWorker(spawn.result(), workdir, sandbox).kill())
    _background.add(task)
    task.add_done_callback(_background.discard)


def render(reply: dict[str, Any], limit: int) -> str:
    """A worker's reply as the model reads it: stdout, stderr, the value and the error, each cut
    to ``limit`` characters with a line saying how much was cut."""
    parts = []
    for key, label in (("stdout", ""), ("stderr", "[stderr]\n"), ("value", "[value]\n")):
        text = reply.get(key) or ""
        total = int(reply.get(f"{key}_total") or len(text))
        if not text and not total:
            continue
        if total > len(text):
            text += f"\n[... {total - len(text):,} more characters of {key} cut: it had {total:,}, the first {len(text):,} are shown]"
        parts.append(label + text.rstrip("\n"))
    if reply.get("error"):
        parts.append("[error]\n" + str(reply["error"]).rstrip("\n"))
    return "\n".join(parts) if parts else "(no output)"

"""A sampler server palaestra runs itself (``sampler.command``): started, waited for, stopped.

The command is split like a shell would (``shlex``) but run without one; leading ``NAME=VALUE``
words set environment variables, as in a shell (``CUDA_VISIBLE_DEVICES=1 vllm serve ...``). It
runs in a process group of its own, its output goes to a log file, and the trainer waits until
``GET URL/models`` answers 200. A command that exits first, or does not answer in time, is one
line that quotes the end of its log; at the end the whole group gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import aiohttp

from palaestra.train.config import ConfigError

ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
POLL_SECONDS = 0.25
STOP_SECONDS = 15.0  # SIGTERM, then this long before SIGKILL (vLLM frees its GPU memory on SIGTERM)


def split_command(command: str) -> tuple[dict[str, str], list[str]]:
    """``"A=1 vllm serve m"`` → (``{"A": "1"}``, ``["vllm", "serve", "m"]``)."""
    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise ConfigError(f"sampler.command {command!r} names no program to run")
    return env, words


def log_tail(path: Path, lines: int = 5, limit: int = 600) -> str:
    """The last ``lines`` non-empty lines of a log, joined with " | " (at most ``limit`` characters)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = " | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])
    return kept if len(kept) <= limit else "..." + kept[-limit:]


class ServerProcess:
    """One sampler server: ``start()`` runs the command and waits until it answers, ``stop()`` ends it."""

    def __init__(self, command: str, log_path: Path) -> None:
        self.env, self.argv = split_command(command)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self, url: str, timeout: float) -> None:
        """Run the command; return once ``url``/models answers. ``ConfigError`` if it cannot start,
        exits, or does not answer within ``timeout`` seconds (the command is stopped then)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,
                )
            except OSError as exc:
                raise ConfigError(
                    f"sampler.command: cannot run {self.argv[0]}: {exc.strerror or exc}"
                ) from None
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                if self.process.poll() is not None:  # its log goes with a new run's folder: quote it
                    tail = log_tail(self.log_path, lines=10, limit=1500)
                    last = f"; its last lines: {tail}" if tail else ""
                    raise ConfigError(f"{self._how()} before it answered at {url}{last}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url + "/models", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    await self.stop()
                    raise ConfigError(
                        f"sampler.command did not answer at {url} within {timeout:g} s "
                        f"(sampler.startup_timeout); its log is {self.log_path}: {log_tail(self.log_path)}"
                    )
                await asyncio.sleep(POLL_SECONDS)

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def exit_reason(self) -> str:
        """``the sampler server (sampler.command) exited with status N; its log is PATH: LAST LINES``."""
        tail = log_tail(self.log_path)
        return f"{self._how()}; its log is {self.log_path}" + (f": {tail}" if tail else "")

    def _how(self) -> str:
        assert self.process is not None
        code = self.process.poll()
        how = (
            f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        )
        return f"the sampler server (sampler.command) {how}"

    async def stop(self) -> None:
        """SIGTERM to the command's process group, SIGKILL if it is still there after ``STOP_SECONDS``."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)

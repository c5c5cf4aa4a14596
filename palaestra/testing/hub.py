"""Helpers for testing against a hub: a small environment package, its builds, a running hub.

``write_env_package`` writes an installable environment package (a ``SingleTurnEnv`` whose task
is to repeat a word, and a ``solve`` policy for ``scripted:MODULE:solve``); ``build_dists``
builds its wheel and sdist offline with hatchling; ``running_hub`` serves a hub from the current
event loop and ``hub_process`` in a child process (which a test may kill).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from queue import Empty, Queue

MODULE = '''\
"""Repeat a word: a tiny environment for the hub's tests."""

import palaestra as pa

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon"]


def exact(completion, answer) -> float:
    return float(completion[-1]["content"].strip() == answer)


def load_environment(num_examples: int = 8) -> pa.SingleTurnEnv:
    rows = [{"question": f"Repeat: {w}", "answer": w} for w in WORDS[:num_examples]]
    return pa.SingleTurnEnv(dataset=rows, system_prompt="Reply with the word only.", rubric=pa.Rubric([exact]))


def solve(messages) -> str:
    """The perfect policy, for ``-m scripted:{module}:solve``."""
    return messages[-1]["content"].removeprefix("Repeat: ")


def lazy(messages) -> str:
    """A policy right half of the time."""
    word = messages[-1]["content"].removeprefix("Repeat: ")
    return word if word in WORDS[::2] else "no"
'''


def write_env_package(
    root: Path,
    *,
    name: str = "palaestra-env-echo",
    version: str = "0.1.0",
    module: str = "echo_env",
    env_name: str = "echo",
    readme: str = "# echo\n\nRepeat a word. A tiny environment for the hub's tests.\n",
    description: str = "Repeat a word: a tiny palaestra environment.",
    keywords: Sequence[str] = ("demo", "single-turn"),
    dependencies: Sequence[str] = ("palaestra",),
    entry_point: bool = True,
    eval_defaults: str = "num_examples = 8\nrollouts_per_example = 1\n",
) -> Path:
    """Write the package into ``root/<module>-<version>/`` and return that folder."""
    folder = root / f"{module}-{version}"
    (folder / module).mkdir(parents=True)
    (folder / module / "__init__.py").write_text(MODULE.replace("{module}", module), encoding="utf-8")
    (folder / "README.md").write_text(readme, encoding="utf-8")
    quoted = ", ".join(_toml(k) for k in keywords)
    deps = ", ".join(f'"{d}"' for d in dependencies)
    entry = f'[project.entry-points."palaestra.environments"]\n{env_name} = "{module}:load_environment"\n'
    (folder / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
        [build-system]
        requires = ["hatchling>=1.24"]
        build-backend = "hatchling.build"

        [project]
        name = "{name}"
        version = "{version}"
        description = {_toml(description)}
        readme = "README.md"
        requires-python = ">=3.11"
        keywords = [{quoted}]
        dependencies = [{deps}]

        """)
        + (entry if entry_point else "")
        + f'\n[tool.hatch.build.targets.wheel]\npackages = ["{module}"]\n\n[tool.palaestra.eval]\n{eval_defaults}',
        encoding="utf-8",
    )
    return folder


def _toml(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


def build_dists(package: Path, out: Path) -> list[Path]:
    """The wheel and the sdist of ``package``, built offline with hatchling (wheel first)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-t", "sdist", "-d", str(out)],
        cwd=package,
        check=True,
        capture_output=True,
    )
    return sorted(out.glob("*.whl")) + sorted(out.glob("*.tar.gz"))


@contextlib.asynccontextmanager
async def running_hub(data: Path, *, max_upload_bytes: int | None = None) -> AsyncIterator[str]:
    """Serve a hub over ``data`` from this event loop on a free port; yields ``http://127.0.0.1:PORT/``."""
    from palaestra.hub.data import HubData
    from palaestra.hub.server import MAX_UPLOAD_BYTES, create_app
    from palaestra.serve import start

    app = create_app(HubData(data), max_upload_bytes=max_upload_bytes or MAX_UPLOAD_BYTES)
    runner, url = await start(app, "127.0.0.1", 0)
    try:
        yield url.removesuffix("v1")
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def hub_process(
    data: Path, *args: str, timeout: float = 30.0, lines: list[str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``palaestra hub serve --data DATA --port 0`` in a child process; yields (URL, process).

    The child's output is read all along (so a chatty hub never blocks on a full pipe) and, if
    ``lines`` is given, appended to it: a test can check what the hub logged.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "palaestra.cli",
        "hub",
        "serve",
        "--data",
        str(data),
        "--port",
        "0",
        *args,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen: list[str] = [] if lines is None else lines
    queue: Queue[str | None] = Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            queue.put(line)
        queue.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while True:  # log lines (a crash's leftovers removed, say) may come before the URL
            try:
                line = queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except Empty:
                raise RuntimeError(f"the hub did not start in {timeout} s: {''.join(seen)}") from None
            if line is None:
                raise RuntimeError(f"the hub did not start: {''.join(seen)}")
            found = re.search(r"at (http://\S+/)", line)
            if found:
                break
        yield found.group(1), proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout)
        if proc.stdout is not None:
            proc.stdout.close()

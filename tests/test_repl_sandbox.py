"""The sandbox of model-written code: what the code cannot do (read or write outside its folder,
open a socket, fork-bomb, exhaust memory, outlive its rollout, see another rollout), and the
refusal to start without it unless the weaker mode is asked for by name."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import palaestra as pa
from palaestra import sandbox as sandbox_module
from palaestra.repl import ReplSession, live_workers
from palaestra.sandbox import ReplLimits, Sandbox
from palaestra.testing.repl import code_policy, sandbox_problem, sandbox_processes

PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no bubblewrap sandbox here: {PROBLEM}")
COUNT_FORKS = (  # forks children that wait, until the process limit says no
    "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
    "            os._exit(0)\n        n += 1\nexcept OSError as exc:\n    print(n, type(exc).__name__)"
)
FAST = ReplLimits(call_seconds=2.0, call_cpu_seconds=2, memory_mb=256, max_processes=8, output_chars=2000)


def session(limits: ReplLimits = FAST) -> ReplSession:
    return ReplSession(Sandbox("bubblewrap"), limits)


async def eventually(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def run_all(repl: ReplSession, *codes: str) -> list[str]:
    try:
        return [await repl.run(code) for code in codes]
    finally:
        await repl.aclose()


async def test_code_cannot_read_outside_its_folder(tmp_path: Path) -> None:
    secret = tmp_path / "run" / "results.jsonl"  # a run folder's output
    secret.parent.mkdir()
    secret.write_text("the answers")
    home = Path.home()
    hidden = sorted(p.name for p in home.iterdir() if not sys.base_prefix.startswith(str(p)))
    assert hidden, "the test needs a home folder with something in it"
    [run, shadow, passwd, listing, repo] = await run_all(
        session(),
        f"open({str(secret)!r}).read()",
        "open('/etc/shadow').read()",
        "open('/etc/passwd').read()",
        f"import os; sorted(os.listdir({str(home)!r})) if os.path.isdir({str(home)!r}) else []",
        f"import os; os.path.exists({str(Path(__file__))!r})",
    )
    assert "FileNotFoundError" in run and "the answers" not in run
    assert "FileNotFoundError" in shadow and "FileNotFoundError" in passwd
    assert not any(repr(name) in listing for name in hidden), listing  # only the Python installation's path
    assert repo.endswith("False")


async def test_code_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    target = tmp_path / "written"
    [usr, python, host, own, big] = await run_all(
        session(ReplLimits(disk_mb=8)),
        "open('/usr/evil', 'w')",
        f"open({os.path.join(sys.base_prefix, 'evil')!r}, 'w')",
        f"open({str(target)!r}, 'w').write('x')",
        "open('notes.txt', 'w').write('mine'); open('/tmp/t', 'w').write('x'); open('notes.txt').read()",
        "open('big', 'wb').write(b'x' * (9 * 2**20))",
    )
    assert "Read-only file system" in usr
    assert "Read-only file system" in python or "Permission denied" in python
    assert "FileNotFoundError" in host and not target.exists()
    assert own.endswith("'mine'")
    assert "No space left on device" in big or "File too large" in big  # disk_mb: the write fails, no kill


async def test_code_cannot_open_a_socket(tmp_path: Path) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    unix_path = str(tmp_path / "host.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0palaestra-test-abstract")
    abstract.listen()
    try:
        [local, outside, named, hidden] = await run_all(
            session(),
            f"import socket; socket.create_connection(('127.0.0.1', {tcp.getsockname()[1]}), timeout=1)",
            "import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)",
            f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({unix_path!r})",
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0palaestra-test-abstract')",
        )
    finally:
        tcp.close(), unix.close(), abstract.close()
    assert "Network is unreachable" in local or "Connection refused" in local, local
    assert "Network is unreachable" in outside
    assert "FileNotFoundError" in named and "ConnectionRefusedError" in hidden


async def test_a_fork_bomb_is_held_to_its_process_limit_and_killed() -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    repl = session()
    try:
        counted = await repl.run(COUNT_FORKS)
        forks = int(counted.split()[0])
        assert forks < FAST.max_processes and "BlockingIOError" in counted, counted
        start = time.monotonic()
        bombed = await repl.run(bomb)
        assert time.monotonic() - start < FAST.call_seconds + 2
        assert "ran past its 2 s of wall time and was killed" in bombed
    finally:
        await repl.aclose()
    await eventually(lambda: not sandbox_processes())


async def test_memory_is_held_to_its_limit() -> None:
    [small, big, grow, after] = await run_all(
        session(),
        "b = bytearray(64 * 2**20); len(b)",
        "c = bytearray(512 * 2**20)",
        "x = []\nwhile True:\n    x.append(bytearray(2**20))",
        "1 + 1",
    )
    assert small.endswith("67108864")
    assert "MemoryError" in big and "the limit is 256 MB" in big
    assert "MemoryError" in grow
    assert "A new worker" in after and after.endswith("2")


async def test_code_cannot_outlive_its_rollout() -> None:
    escape = textwrap.dedent("""
        import os, subprocess
        subprocess.Popen(['sleep', '1000'], start_new_session=True)
        if os.fork() == 0:          # a daemon: fork, new session, fork again
            os.setsid()
            if os.fork() == 0:
                import time; time.sleep(1000)
            os._exit(0)
        'started'
    """)
    env = pa.ReplEnv(dataset=[{"question": "go"}], limits=FAST)
    [rollout] = await env.run(pa.ScriptedClient(code_policy(escape)))
    assert rollout.completion[1]["content"].endswith("'started'")
    await eventually(lambda: not sandbox_processes())
    assert live_workers() == 0


def test_no_worker_outlives_a_killed_run(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent("""
        import asyncio, sys
        from palaestra.repl import ReplSession
        from palaestra.sandbox import Sandbox, ReplLimits
        async def main():
            repl = ReplSession(Sandbox(), ReplLimits())
            await repl.run("import subprocess; subprocess.Popen(['sleep', '1000'])")
            print("ready", flush=True)
            await repl.run("import time; time.sleep(1000)")
        asyncio.run(main())
    """)
    )
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == "ready"
        assert sandbox_processes()
        run.send_signal(signal.SIGKILL)  # the whole run dies at once: no cleanup code runs
        run.wait(10)
        deadline = time.monotonic() + 5
        while sandbox_processes():
            assert time.monotonic() < deadline, f"left behind: {sandbox_processes()}"
            time.sleep(0.02)
    finally:
        run.kill()


async def test_rollouts_cannot_see_each_others_state() -> None:
    first, second = session(), session()
    try:
        await first.run("secret = 42\nopen('mine.txt', 'w').write('a')\nopen('/tmp/mine', 'w').write('b')")
        seen = await second.run(
            "import os\n"
            "print('secret' in globals(), os.path.exists('mine.txt'), os.path.exists('/tmp/mine'))\n"
            "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
        )
    finally:
        await first.aclose()
        await second.aclose()
    lines = seen.splitlines()
    assert lines[0] == "False False False"
    assert len(eval(lines[1])) <= 3  # its own PID namespace: the sandbox's init and the worker


async def test_no_process_is_left_after_200_rollouts_with_random_cancellations() -> None:
    env = pa.ReplEnv(dataset=[{"question": str(i)} for i in range(50)], limits=FAST)
    client = pa.ScriptedClient(code_policy("import time; time.sleep(0.05); x = 1", "x + 1"))
    rng = random.Random(0)

    async def one(example: pa.Example, index: int) -> pa.Rollout | None:
        task = asyncio.create_task(env.rollout(client, example, rollout_index=index))
        if rng.random() < 0.5:  # cancelled at a random moment: starting, running code, cleaning up
            await asyncio.sleep(rng.uniform(0, 0.15))
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return None

    limit = asyncio.Semaphore(16)

    async def limited(example: pa.Example, index: int) -> pa.Rollout | None:
        async with limit:
            return await one(example, index)

    results = await asyncio.gather(*(limited(e, i) for i in range(4) for e in env.examples))
    finished = [r for r in results if r is not None]
    assert len(results) == 200 and 40 < len(finished) < 200
    assert all(r.error is None and r.completion[-1]["content"] == "done" for r in finished)
    assert live_workers() == 0
    await eventually(lambda: not sandbox_processes())


def test_without_bubblewrap_the_environment_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sandbox_module, "_checked", set())
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    with pytest.raises(pa.SandboxUnavailable, match="needs bubblewrap, which is not installed"):
        pa.ReplEnv(dataset=[{"question": "x"}])
    pa.ReplEnv(dataset=[{"question": "x"}], sandbox="rlimits")  # the weaker mode, asked for by name
    with pytest.raises(ValueError, match="sandbox must be one of bubblewrap, rlimits"):
        pa.ReplEnv(dataset=[{"question": "x"}], sandbox="none")


def test_bubblewrap_without_namespaces_is_a_clear_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(sandbox_module, "_checked", set())
    with pytest.raises(
        pa.SandboxUnavailable, match=r"No permissions to create new namespace.*sandbox='rlimits'"
    ):
        Sandbox("bubblewrap").check()


SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
AS_USER = """
import sys
sys.path[:0] = PATHS
import asyncio
from palaestra.repl import ReplSession
from palaestra.sandbox import Sandbox, ReplLimits

async def main():
    repl = ReplSession(Sandbox(), ReplLimits(max_processes=8))
    print(await repl.run("import os; os.getuid(), os.path.exists('/root'), os.path.exists('/etc')"))
    print(await repl.run(COUNT))
    await repl.aclose()

asyncio.run(main())
"""


def readable_by_anyone(path: Path) -> bool:
    """Whether any user may read ``path``: it is world-readable and every folder above it world-searchable."""
    path = path.resolve()
    if not path.exists() or not path.stat().st_mode & stat.S_IROTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.parents)


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.is_file(), reason="needs root and a system Python")
def test_as_an_ordinary_user_the_sandbox_uses_a_user_namespace() -> None:
    """The path of a user who is not root (bubblewrap in a user namespace), run as uid 4321 with
    the system's Python, this checkout and its packages on sys.path."""
    import site
    import tempfile

    paths = [str(Path(pa.__file__).parent.parent), *site.getsitepackages()]
    closed = [p for p in paths if not readable_by_anyone(Path(p))]
    if closed:  # e.g. a checkout in a `mktemp -d` folder (mode 700): uid 4321 cannot import from it
        pytest.skip(
            f"{closed[0]} is not readable by other users, so the ordinary user cannot import palaestra"
        )
    with tempfile.TemporaryDirectory() as folder:  # pytest's tmp_path is root's alone
        os.chmod(folder, 0o755)
        script = Path(folder) / "as_user.py"
        script.write_text(AS_USER.replace("PATHS", repr(paths)).replace("COUNT", repr(COUNT_FORKS)))
        done = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "4321",
                "--regid",
                "4321",
                "--clear-groups",
                "env",
                "-i",
                "PATH=/usr/bin:/bin",
                f"HOME={folder}",
                str(SYSTEM_PYTHON),
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[1].startswith("(4321, False, False)")  # its own uid; no /root, no /etc
    forks, error = lines[-1].split()
    assert error == "BlockingIOError" and int(forks) < 8  # the process limit holds in a user namespace
    assert not sandbox_processes()

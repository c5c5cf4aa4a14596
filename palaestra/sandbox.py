"""The sandbox that model-written code runs in: bubblewrap namespaces plus rlimits.

Running code a model wrote is the most dangerous thing an environment does, so palaestra does not
restrict it by hand: ``bubblewrap`` (Debian's ``bubblewrap``, the sandbox Flatpak uses) starts the
worker in new network, PID, IPC, UTS and cgroup namespaces, with a root filesystem that holds a
read-only view of ``/usr`` and of the Python installation, a fresh ``/proc`` and ``/dev``, and a
private tmpfs as its working directory (``/work``) and ``/tmp``. Nothing else of the machine is
there: not the user's home, not the run's outputs, not ``/etc``. The worker has no capabilities;
as root it runs as a random unprivileged user id (Linux does not apply the process limit to
root), otherwise as the user in a user namespace. The worker then sets its own rlimits (address
space, CPU time, processes, file size, open files) before it runs any model code.

If bubblewrap is missing or cannot create namespaces here, ``Sandbox("bubblewrap").check()``
raises ``SandboxUnavailable`` and the environment refuses to start; ``Sandbox("rlimits")`` is
the weaker mode a user must ask for by name: the rlimits alone, no isolation of files, network
or processes. Its ``note`` says so, and runs record it in their metadata and summary.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("bubblewrap", "rlimits")
WEAK_NOTE = (
    "weaker sandbox (rlimits only): model code ran without namespaces, so it could read the user's "
    "files, use the network and leave processes behind"
)
WORKDIR = "/work"  # the worker's working directory inside bubblewrap
SOCKET_DIR = "/run/palaestra"  # where sockets given to the worker appear inside bubblewrap
_checked: set[str] = set()  # modes found to work in this process


class SandboxUnavailable(OSError):
    """The sandbox cannot start on this machine (no bubblewrap, no namespaces); says what to do."""


@dataclass(frozen=True)
class ReplLimits:
    """What one call and one rollout of model code may use; a call past a limit is killed.

    Per call: ``call_seconds`` of wall time (sub-model calls included), ``call_cpu_seconds`` of
    CPU time (whole seconds: rlimits count in seconds), at most ``output_chars`` characters each
    of stdout, stderr and the last value shown. Per rollout (the worker and the ones started after
    a kill): ``rollout_seconds`` of wall time and ``rollout_cpu_seconds`` of CPU over all calls,
    ``memory_mb`` of address space, ``max_processes`` processes and threads at once, ``disk_mb``
    in its working directory and ``/tmp`` (and as the largest file it may write).
    """

    call_seconds: float = 10.0
    call_cpu_seconds: int = 10
    rollout_seconds: float = 120.0
    rollout_cpu_seconds: int = 60
    memory_mb: int = 1024
    max_processes: int = 16
    disk_mb: int = 64
    output_chars: int = 4000

    def __post_init__(self) -> None:
        for name in ("call_seconds", "rollout_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"limits: {name} must be a positive number of seconds, got {value!r}")
        lowest = {"memory_mb": 64, "max_processes": 4, "output_chars": 100}
        for name in (
            "call_cpu_seconds",
            "rollout_cpu_seconds",
            "memory_mb",
            "max_processes",
            "disk_mb",
            "output_chars",
        ):
            value, low = getattr(self, name), lowest.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"limits: {name} must be an integer ≥ {low}, got {value!r}")

    @classmethod
    def from_dict(cls, data: Any) -> ReplLimits:
        """Limits from a dict (``load_environment``'s ``limits`` argument); unknown keys are refused."""
        if isinstance(data, ReplLimits):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"limits must be an object of limits, not {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"limits: unknown {', '.join(unknown)}; the limits are: {', '.join(sorted(known))}"
            )
        return cls(**data)


class Sandbox:
    """How a worker process is started: ``"bubblewrap"`` (the default) or the weaker ``"rlimits"``."""

    def __init__(self, mode: str = "bubblewrap") -> None:
        if mode not in MODES:
            raise ValueError(f"sandbox must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        self.prefix = os.path.realpath(sys.base_prefix)

    @property
    def note(self) -> str | None:
        """What a run must say about this sandbox: None for bubblewrap, the weakness otherwise."""
        return WEAK_NOTE if self.mode == "rlimits" else None

    def check(self) -> None:
        """``SandboxUnavailable`` unless a worker can start here (tried once per process and mode)."""
        if self.mode in _checked:
            return
        if self.mode == "bubblewrap" and shutil.which("bwrap") is None:
            raise SandboxUnavailable(
                "the sandbox needs bubblewrap, which is not installed (Debian/Ubuntu: apt-get install "
                "bubblewrap); or pass sandbox='rlimits' to run model code with rlimits only (weaker: no "
                "isolation of files, network or processes)"
            )
        workdir = self.make_workdir()
        try:
            argv, options = self.command([self.python, "-I", "-S", "-c", "pass"], workdir=workdir)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, **options)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"the {self.mode} sandbox cannot start here: {exc}") from None
        finally:
            self.remove_workdir(workdir)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise SandboxUnavailable(
                f"the {self.mode} sandbox cannot start here ({said}); bubblewrap needs user namespaces "
                "(or root). Pass sandbox='rlimits' to run model code with rlimits only (weaker: no "
                "isolation of files, network or processes)"
            )
        _checked.add(self.mode)

    def make_workdir(self) -> str | None:
        """A fresh host folder for an ``rlimits`` worker to work in (bubblewrap needs none)."""
        if self.mode == "bubblewrap":
            return None
        import tempfile

        return tempfile.mkdtemp(prefix="palaestra-repl-")

    def remove_workdir(self, workdir: str | None) -> None:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def command(
        self,
        argv: list[str],
        *,
        workdir: str | None,
        sockets: dict[str, str] | None = None,
        disk_mb: int = 64,
    ) -> tuple[list[str], dict[str, Any]]:
        """The argv that runs ``argv`` (a command inside the sandbox) and the ``Popen`` options.

        ``sockets`` maps a name to a host Unix socket the worker may use; the worker finds its
        path inside in ``PALAESTRA_SOCKET_<NAME>``. ``disk_mb`` sizes the tmpfs of ``/work`` and
        ``/tmp`` (each). Options start a new session, so the worker
        can be killed as a process group.
        """
        sockets = sockets or {}
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
        }
        if self.mode == "rlimits":
            env["HOME"] = str(workdir)
            env.update({f"PALAESTRA_SOCKET_{k.upper()}": v for k, v in sockets.items()})
            return argv, {"cwd": workdir, "env": env, "start_new_session": True}
        env["HOME"] = WORKDIR
        out = [
            "bwrap",
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--clearenv",
        ]
        options: dict[str, Any] = {"start_new_session": True}
        for key, value in env.items():
            out += ["--setenv", key, value]
        out += ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64"):  # merged /usr: links; else read-only binds
            path = Path("/", top)
            if path.is_symlink():
                out += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                out += ["--ro-bind", str(path), str(path)]
        if not self.prefix.startswith("/usr/"):  # a Python installed elsewhere (pyenv, conda, /opt)
            out += ["--ro-bind", self.prefix, self.prefix]
        out += ["--proc", "/proc", "--dev", "/dev"]
        size = str(disk_mb * 2**20)
        out += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
        out += ["--size", size, "--perms", "1777", "--tmpfs", WORKDIR, "--chdir", WORKDIR]
        if sockets:
            out += ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", SOCKET_DIR]
        for name, host in sockets.items():
            inside = f"{SOCKET_DIR}/{name}.sock"
            out += ["--bind", host, inside, "--setenv", f"PALAESTRA_SOCKET_{name.upper()}", inside]
        if os.geteuid() == 0:
            # root keeps bubblewrap's privileged mode, and the worker drops to an unprivileged id of
            # its own: Linux never applies RLIMIT_NPROC to root, so a fork bomb would not be stopped
            uid = str(worker_uid())
            out += [
                "--",
                "setpriv",
                "--reuid",
                uid,
                "--regid",
                uid,
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
            ]
        else:
            out[1:1] = ["--unshare-user", "--cap-drop", "ALL"]
            out += ["--"]
        return out + argv, options


def worker_uid() -> int:
    """A random unprivileged user id for a worker started by root: workers never share one, so
    each one's process limit counts its own processes only."""
    return 2_000_000 + secrets.randbelow(1_000_000_000)

"""``palaestra install``: an environment and its ``palaestra-env-*`` dependencies, from the hub only.

It is safe against dependency confusion and against pip's own settings: packages named
``palaestra-env-*`` come from the hub and from nowhere else. Each is installed from the exact file
the hub lists (``NAME @ URL#sha256=HASH``) by a pip that reads no configuration file and no ``PIP_*``
variable, and so is ``palaestra`` itself when the hub serves it and the interpreter has no
palaestra that satisfies the environment already (a source checkout is never replaced); every
other requirement comes from pip's own configured index, in a second pip call that names the
hub's files again; then each ``palaestra-env-*`` distribution installed is checked.

The planner (``install_plan``) reads the hub's index (PEP 691 JSON from a hub, PEP 503 HTML from a
static copy made by ``palaestra hub export``), follows extras, honours yanks and ``Requires-Python``,
and gives each hub package one version: a later requirement that version does not satisfy is refused
(no backtracking).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import orjson
from packaging.utils import canonicalize_name

from palaestra.hub.client import HubError
from palaestra.hub.dist import FRAMEWORK, PREFIX
from palaestra.hub.install_plan import HubFile, Plan, plan_install

PIP_NO_CONFIG = ("--isolated", "--disable-pip-version-check", "--no-input")  # with PIP_CONFIG_FILE=os.devnull
# Run in the target interpreter: its marker environment (packaging's default_environment, in the
# standard library only) and its installed palaestra-env-* distributions, with where each came from.
_INSPECT = """\
import sys
del sys.path[0]  # not the current folder's modules
import hashlib, importlib.metadata as md, json, os, platform, re
v = sys.implementation.version
level = "" if v.releaselevel == "final" else v.releaselevel[0] + str(v.serial)
environment = {
    "implementation_name": sys.implementation.name, "implementation_version": f"{v.major}.{v.minor}.{v.micro}{level}",
    "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
    "platform_system": platform.system(), "platform_version": platform.version(),
    "python_full_version": platform.python_version(), "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
}
dists = {}
for d in md.distributions():
    name = re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower()
    if (name.startswith(sys.argv[1]) or name == sys.argv[2]) and name not in dists:  # the first found is imported
        record = (d.read_text("RECORD") or "").encode()
        dists[name] = {"version": d.version, "direct_url": d.read_text("direct_url.json"),
                       "record": hashlib.sha256(record).hexdigest()}
print(json.dumps({"environment": environment, "dists": dists}))
"""


@dataclass(frozen=True)
class PipCommand:
    """A pip call of ``install``; an ``isolated`` one reads no pip configuration and no ``PIP_*`` variable."""

    argv: tuple[str, ...]
    isolated: bool = False

    def env(self) -> dict[str, str] | None:
        """The environment to run it in (``None``: this one)."""
        if not self.isolated:
            return None  # the user's own pip settings, as they are
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull  # pip then skips every config file: global, user, site
        return env

    def __str__(self) -> str:
        """The command as a shell line; ``--isolated`` already makes pip ignore ``PIP_*`` variables."""
        line = shlex.join(self.argv)
        return f"PIP_CONFIG_FILE={shlex.quote(os.devnull)} {line}" if self.isolated else line


@dataclass(frozen=True)
class Target:
    """The interpreter ``install`` installs into: its marker environment and its palaestra-env-* dists."""

    python: str
    environment: dict[str, str]
    dists: dict[str, dict[str, str | None]]


def _run(
    argv: Sequence[str], *, env: dict[str, str] | None = None, what: str = "pip"
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
    except OSError as exc:
        raise HubError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise HubError(f"{what} failed: {tail}")
    return done


def inspect_target(python: str) -> Target:
    """Ask ``python`` for its marker environment and its installed environment packages."""
    done = _run([python, "-c", _INSPECT, PREFIX, FRAMEWORK], what=f"inspecting {python}")
    try:
        data = orjson.loads(done.stdout)
        return Target(python, dict(data["environment"]), dict(data["dists"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise HubError(f"{python} is not a Python interpreter: it did not describe itself") from None


def _pip_install(python: str, *args: str, isolated: bool = False) -> PipCommand:
    flags = PIP_NO_CONFIG if isolated else ()
    return PipCommand((python, "-m", "pip", "install", *flags, *args), isolated=isolated)


def choose_files(url: str, plan: Plan, python: str) -> list[HubFile]:
    """The hub file pip picks for each of the plan's packages in ``python`` (its tags, its Python).

    pip chooses from the hub's index alone (a dry run, no configuration read); each choice must
    be a file the hub lists, with the sha256 the hub lists.
    """
    with tempfile.TemporaryDirectory(prefix="palaestra-install-") as tmp:
        report = Path(tmp) / "report.json"
        index = urljoin(url, "simple/")
        flags = ("--dry-run", "--ignore-installed", "--no-deps", "--quiet", "--report", str(report))
        probe = _pip_install(python, *flags, "--index-url", index, *plan.hub, isolated=True)
        try:
            _run(probe.argv, env=probe.env(), what="choosing the hub's files with pip")
        except HubError as exc:
            if "no such option" in str(exc):
                raise HubError(
                    f"palaestra install needs pip 22.2 or newer in {python}: {python} -m pip install -U pip"
                ) from None
            raise
        chosen = orjson.loads(report.read_bytes()).get("install", [])
    out: dict[str, HubFile] = {}
    for item in chosen:
        name = str(canonicalize_name(item["metadata"]["name"]))
        filename, sha256 = _archive(item["download_info"])
        hub_file = plan.files.get(name, {}).get(filename)
        if hub_file is None or hub_file.sha256 != sha256:
            raise HubError(
                f"pip chose {filename} (sha256 {sha256 or '?'}) for {name}: not a file the hub lists"
            )
        out[name] = hub_file
    missing = [name for name in plan.files if name not in out]
    if missing:
        raise HubError(f"pip found no file on the hub for {', '.join(missing)} that installs in {python}")
    return [out[name] for name in plan.files]


def install_commands(files: Sequence[HubFile], others: Sequence[str], python: str) -> list[PipCommand]:
    """The hub's files, pinned by URL and sha256, by a pip that reads no configuration; then the rest.

    The second call uses pip's own configuration and index for ``others``, and names the hub's
    files again, so its resolver cannot take any other file or version for them.
    """
    pins = [f.pin for f in files]
    out = [_pip_install(python, "--no-deps", "--force-reinstall", "--no-index", *pins, isolated=True)]
    if others:
        out.append(_pip_install(python, *others, *pins))
    return out


def _archive(info: dict[str, Any]) -> tuple[str, str]:
    """The file name and sha256 of a PEP 610 direct URL record (pip's report has the same shape)."""
    archive = info.get("archive_info") or {}
    sha256 = (archive.get("hashes") or {}).get("sha256") or str(archive.get("hash", "")).partition("=")[2]
    return unquote(urlsplit(str(info.get("url", ""))).path.rpartition("/")[2]), str(sha256)


def _is_file(dist: dict[str, str | None], hub_file: HubFile) -> bool:
    """Whether an installed distribution was installed from ``hub_file`` (its PEP 610 record)."""
    try:
        filename, sha256 = _archive(orjson.loads(dist["direct_url"] or "{}"))
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return dist["version"] == hub_file.version and sha256 == hub_file.sha256 and filename == hub_file.filename


def verify(before: Target, files: Sequence[HubFile]) -> None:
    """After pip: each hub package is installed from its hub file, and no other palaestra-env-* changed."""
    after = inspect_target(before.python)
    python = before.python
    for f in files:
        dist = after.dists.get(f.name)
        if dist is None or not _is_file(dist, f):
            raise HubError(f"{f.name} in {python} is not the hub's {f.filename} after pip ran")
    planned = {f.name for f in files}
    for name, dist in after.dists.items():
        if name.startswith(PREFIX) and name not in planned and dist != before.dists.get(name):
            raise HubError(
                f"pip installed {name} {dist['version']} from outside the hub, as a dependency of a "
                f"package from pip's own index: remove it with {python} -m pip uninstall {name}"
            )


def install(
    url: str, requirement: str, *, python: str = sys.executable, no_deps: bool = False, dry_run: bool = False
) -> list[PipCommand]:
    """Install an environment from the hub; returns the pip commands (run unless ``dry_run``).

    The hub's packages are installed from the exact files the hub lists, checked by sha256, whatever
    pip's configuration says; the other dependencies from pip's own index. After pip, every
    ``palaestra-env-*`` distribution in ``python`` is checked: the hub's, or as it was before.
    """
    from palaestra.runner import run_async

    before = inspect_target(python)
    have = {n: str(d["version"]) for n, d in before.dists.items() if n == FRAMEWORK and d["version"]}
    plan = run_async(plan_install(url, requirement, environment=before.environment, installed=have))
    files = choose_files(url, plan, python)
    commands = install_commands(files, () if no_deps else plan.others, python)
    if not dry_run:
        for command in commands:
            _run(command.argv, env=command.env())
        verify(before, files)
    return commands

"""``palaestra install``: an environment and its ``palaestra-env-*`` dependencies, from the hub only.

It is safe against dependency confusion and against pip's own settings: packages named
``palaestra-env-*`` come from the hub and from nowhere else. Each is installed from the exact file
the hub lists (``NAME @ URL#sha256=HASH``) by a pip that reads no configuration file and no ``PIP_*``
variable, and so is ``palaestra`` itself when the hub serves it and the interpreter has no
palaestra that satisfies the environment already (a source checkout is never replaced); every other requirement comes from pip's own configured index, in a second pip call that
names the hub's files again; then each ``palaestra-env-*`` distribution installed is checked.

The planner reads the hub's index (PEP 691 JSON from a hub, PEP 503 HTML from a static copy made
by ``palaestra hub export``), follows extras, honours yanks and ``Requires-Python``, and gives each
hub package one version: a later requirement that version does not satisfy is refused (no backtracking).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import compat32
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import orjson
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from palaestra.hub.client import HubError, index_files, project_name, request
from palaestra.hub.dist import FRAMEWORK, PREFIX

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
class HubFile:
    """One distribution file as the hub's index lists it: where it is and its sha256."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str

    @property
    def pin(self) -> str:
        """A requirement that only this file satisfies (pip checks the download against the hash)."""
        return f"{self.name} @ {self.url}#sha256={self.sha256}"


@dataclass(frozen=True)
class Plan:
    """What ``install`` will do: hub packages pinned, and the rest for pip's own index."""

    hub: tuple[str, ...]  # "name==version"
    others: tuple[str, ...]
    # name → filename → file, for the pinned versions
    files: dict[str, dict[str, HubFile]] = field(default_factory=dict, compare=False)


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


@dataclass
class _Project:
    """A project's releases on the hub, as the planner needs them (files that fit the target only)."""

    versions: list[Version]  # every version listed
    yanked: set[Version]
    files: dict[Version, dict[str, HubFile]]  # the pinnable files that install in the target's Python
    metadata: dict[Version, str]  # the URL of one core metadata file per version


def _fits(requires_python: str, python: Version) -> bool:
    try:
        return not requires_python or SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:
        return False  # a file whose Requires-Python cannot be read is not taken


async def _project(url: str, name: str, python: Version) -> _Project:
    """A project's versions on the hub, the yanked ones, its files and their core metadata."""
    project = _Project([], set(), {}, {})
    for f in await index_files(url, name):
        if (version := f.version) is None:
            continue
        project.versions.append(version)
        if f.yanked:
            project.yanked.add(version)
        if not f.sha256 or not _fits(f.requires_python, python):
            continue
        project.files.setdefault(version, {})[f.filename] = HubFile(
            name, str(version), f.filename, f.url, f.sha256
        )
        if f.metadata and (f.filename.endswith(".whl") or version not in project.metadata):
            project.metadata[version] = f.url + ".metadata"
    project.versions = sorted(set(project.versions))
    return project


def _choose(project: _Project, name: str, req: Requirement, python: Version) -> Version:
    """The version of ``name`` to install for ``req``: the newest that matches, as pip chooses.

    A yanked release only when pinned with ``==`` or ``===`` (PEP 592); a pre-release only when
    nothing else matches.
    """
    pinned = any(s.operator in ("==", "===") and not s.version.endswith(".*") for s in req.specifier)
    allowed = [
        v
        for v in sorted(project.files)
        if req.specifier.contains(v, prereleases=True) and (pinned or v not in project.yanked)
    ]
    stable = [v for v in allowed if not v.is_prerelease] or allowed
    if not stable:
        listed = ", ".join(map(str, project.versions)) or "none"
        raise HubError(
            f"no version of {name} on the hub matches {str(req.specifier) or 'any'} for Python {python} "
            f"(versions: {listed}; yanked: {len(project.yanked)})"
        )
    return stable[-1]


async def _requires(metadata_url: str, name: str, version: Version) -> tuple[list[Requirement], set[str]]:
    """The ``Requires-Dist`` and ``Provides-Extra`` of one release, from its core metadata on the hub."""
    meta = BytesParser(policy=compat32).parsebytes(await request("GET", metadata_url))
    try:
        same = canonicalize_name(str(meta["Name"] or "")) == name and Version(str(meta["Version"])) == version
    except InvalidVersion:
        same = False
    if not same:
        raise HubError(f"{metadata_url} is not the core metadata of {name} {version}")
    requires = []
    for line in meta.get_all("Requires-Dist") or []:
        try:
            requires.append(Requirement(line))
        except InvalidRequirement:
            raise HubError(f"{name} {version} requires {line!r}: not a valid requirement") from None
    return requires, {str(canonicalize_name(e)) for e in meta.get_all("Provides-Extra") or []}


def _command_line_requirement(requirement: str) -> Requirement:
    try:
        req = Requirement(requirement)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]  # the rest draws a caret under the text
        raise HubError(
            f"{requirement!r} is not a requirement such as tictactoe or tictactoe==0.1.0: {reason}"
        ) from None
    if req.url or req.marker:
        raise HubError(
            f"{requirement!r}: give a name and a version, such as tictactoe==0.1.0, not a URL or marker"
        )
    req.name = project_name(req.name)
    return req


def _unmarked(req: Requirement) -> str:
    """``req`` without its marker, which the planner has already evaluated for the target."""
    copy = Requirement(str(req))
    copy.marker = None
    return str(copy)


async def plan_install(
    url: str,
    requirement: str,
    *,
    environment: dict[str, str] | None = None,
    installed: dict[str, str] | None = None,
) -> Plan:
    """Resolve ``requirement`` (an env name or project, optionally with extras and a version specifier)
    on the hub.

    ``environment`` is the target interpreter's marker environment (this one's if ``None``). Each hub
    package gets one version; a later requirement that this version does not satisfy is an error.
    ``installed`` (name → version) is what the target has of ``palaestra``: kept when it satisfies.
    """
    first = _command_line_requirement(requirement)
    env = environment or {}  # packaging fills in this interpreter's values for the keys left out
    full = env.get("python_full_version") or platform.python_version()
    try:
        python = Version(full)
    except InvalidVersion:  # a development build's "3.14.0+"
        python = Version(full.rstrip("+"))
    pinned: dict[str, Version] = {}
    files: dict[str, dict[str, HubFile]] = {}
    requires: dict[str, tuple[list[Requirement], set[str]] | None] = {}
    extras_done: dict[str, set[str]] = {}
    others: list[str] = []
    seen: dict[str, bool] = {}
    todo = [first]
    while todo:
        req = todo.pop()
        name = str(canonicalize_name(req.name))
        if name not in pinned:
            project = await _project(url, name, python)
            version = pinned[name] = _choose(project, name, req, python)
            files[name] = project.files[version]
            meta = project.metadata.get(version)
            requires[name] = await _requires(meta, name, version) if meta else None
            extras_done[name] = set()
        elif not req.specifier.contains(pinned[name], prereleases=True):
            raise HubError(f"{req} is required, but {name} {pinned[name]} is already planned: they conflict")
        # "" stands for the release's own requirements; each extra adds its own (PEP 685 names)
        new = ({""} | {str(canonicalize_name(e)) for e in req.extras}) - extras_done[name]
        extras_done[name] |= new
        deps, provides = requires[name] or ([], None)  # None: an sdist only, pip reads its requirements
        if provides is None and new - {""}:
            raise HubError(f"{name} {pinned[name]} has no core metadata on the hub: its extras are unknown")
        if unknown := sorted(new - {""} - (provides or set())):
            extras = ", ".join(sorted(provides or ())) or "none"
            raise HubError(f"{name} {pinned[name]} has no extra {', '.join(unknown)} (its extras: {extras})")
        for dep in deps:
            if dep.marker is None and "" not in new:
                continue  # taken on the first visit
            if dep.marker is not None and not any(dep.marker.evaluate({**env, "extra": e}) for e in new):
                continue
            dep_name = str(canonicalize_name(dep.name))
            if dep_name == FRAMEWORK and _satisfied(dep, (installed or {}).get(FRAMEWORK)):
                continue  # the palaestra already there (a source checkout, say) stays
            if dep_name.startswith(PREFIX) or (
                dep_name == FRAMEWORK and await _hub_has(url, FRAMEWORK, seen)
            ):
                todo.append(dep)
            else:
                others.append(_unmarked(dep))
    hub = tuple(f"{n}=={v}" for n, v in pinned.items())
    return Plan(hub=hub, others=tuple(dict.fromkeys(others)), files=files)


def _satisfied(req: Requirement, version: str | None) -> bool:
    """Whether an installed ``version`` (None: not installed) satisfies ``req``."""
    try:
        return version is not None and req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


async def _hub_has(url: str, name: str, seen: dict[str, bool]) -> bool:
    """Whether the hub serves ``name`` (``palaestra`` itself: then it comes from the hub like the rest)."""
    if name not in seen:
        try:
            seen[name] = bool(await index_files(url, name))
        except HubError as exc:
            if "is not on the hub" not in str(exc):
                raise
            seen[name] = False
    return seen[name]


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

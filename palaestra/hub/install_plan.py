"""Planning ``palaestra install`` apart from carrying it out: requirements resolved on the hub's index."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import compat32

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from palaestra.hub.client import HubError, index_files, project_name, request
from palaestra.hub.dist import FRAMEWORK, PREFIX


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

"""Talking to a hub: publish, install, search, attach results, yank.

The hub is found from ``--hub URL`` or ``PALAESTRA_HUB_URL``; write calls send the API token in
``PALAESTRA_HUB_TOKEN``. Uploads use the form ``twine`` sends, so ``twine upload
--repository-url HUB/legacy/`` works as well.

``install`` is safe against dependency confusion and against pip's own settings: packages named
``palaestra-env-*`` come from the hub and from nowhere else. Each is installed from the exact file
the hub lists (``NAME @ URL#sha256=HASH``) by a pip that reads no configuration file and no ``PIP_*``
variable; every other requirement comes from pip's own configured index, in a second pip call that
names the hub's files again; then each ``palaestra-env-*`` distribution installed is checked.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import compat32
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import aiohttp
import orjson
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from palaestra.hub.dist import ENTRY_POINT_GROUP, PREFIX, DistError, check_project_name
from palaestra.hub.index import JSON_TYPE

URL_VAR = "PALAESTRA_HUB_URL"
TOKEN_VAR = "PALAESTRA_HUB_TOKEN"
TIMEOUT = aiohttp.ClientTimeout(total=600, connect=10)


class HubError(Exception):
    """A hub call that failed; the message is one line for the user."""


def hub_url(url: str | None) -> str:
    """The hub's base URL with a trailing ``/``, from the flag or ``PALAESTRA_HUB_URL``."""
    url = url or os.environ.get(URL_VAR)
    if not url:
        raise HubError(f"no hub given: pass --hub URL or set {URL_VAR}")
    if not url.startswith(("http://", "https://")):
        raise HubError(f"hub URL {url!r} must start with http:// or https://")
    return url.rstrip("/") + "/"


def hub_token(var: str = TOKEN_VAR) -> str:
    token = os.environ.get(var)
    if not token:
        raise HubError(
            f"this needs an API token in ${var} (the hub's admin makes one: palaestra hub token USER)"
        )
    return token


def project_name(name: str) -> str:
    """``tictactoe`` or ``palaestra-env-tictactoe`` → ``palaestra-env-tictactoe``."""
    name = str(canonicalize_name(name))
    return name if name.startswith(PREFIX) else PREFIX + name


async def _request(method: str, url: str, *, token: str | None = None, **kwargs: Any) -> bytes:
    headers = kwargs.pop("headers", {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.request(method, url, headers=headers, **kwargs) as response,
        ):
            body = await response.read()
            if response.status >= 400:
                text = body.decode("utf-8", errors="replace").strip() or response.reason
                raise HubError(f"{method} {url}: {response.status} {text}")
            return body
    except aiohttp.ClientError as exc:
        raise HubError(f"cannot reach the hub at {url}: {exc}") from None
    except TimeoutError:
        raise HubError(f"the hub at {url} did not answer in time") from None


# publishing


def check_env_dir(env_dir: Path) -> str:
    """The package name of an environment folder, if it can be published; ``HubError`` if not."""
    pyproject = env_dir / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HubError(f"{pyproject}: {exc}") from None
    project = data.get("project", {})
    try:
        name = check_project_name(str(project.get("name", "")))
    except DistError as exc:
        raise HubError(f"{pyproject}: {exc}") from None
    if not project.get("entry-points", {}).get(ENTRY_POINT_GROUP):
        raise HubError(f'{pyproject}: no [project.entry-points."{ENTRY_POINT_GROUP}"] table: nothing to load')
    return name


def build(env_dir: Path, out: Path, *, isolation: bool = True) -> list[Path]:
    """Build the wheel and the sdist of ``env_dir`` into ``out`` with the standard ``build`` tool."""
    check_env_dir(env_dir)
    if importlib.util.find_spec("build") is None:
        raise HubError("publishing builds with the `build` package: pip install 'palaestra[hub]'")
    command = [sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(out), str(env_dir)]
    if not isolation:
        command.append("--no-isolation")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise HubError(f"building {env_dir} failed: {tail}")
    return sorted(out.glob("*.whl")) + sorted(out.glob("*.tar.gz"))


async def upload(url: str, token: str, paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Upload distribution files, in order; stops at the first the hub refuses."""
    done = []
    for path in paths:
        form = aiohttp.FormData()
        form.add_field(":action", "file_upload")
        form.add_field("protocol_version", "1")
        with path.open("rb") as f:
            form.add_field("content", f, filename=path.name, content_type="application/octet-stream")
            body = await _request("POST", urljoin(url, "legacy/"), token=token, data=form)
        done.append(orjson.loads(body))
    return done


def publish(url: str, token: str, env_dir: Path, *, isolation: bool = True) -> list[dict[str, Any]]:
    from palaestra.runner import run_async

    with tempfile.TemporaryDirectory(prefix="palaestra-publish-") as tmp:
        paths = build(env_dir, Path(tmp), isolation=isolation)
        return run_async(upload(url, token, paths))


# reading


async def projects(url: str) -> list[dict[str, Any]]:
    """Every project on the hub (works against a static export too)."""
    data = orjson.loads(await _request("GET", urljoin(url, "api/projects.json")))
    return list(data["projects"])


def matches(project: dict[str, Any], text: str) -> bool:
    haystack = " ".join([project["name"], project["summary"], *project["environments"], *project["keywords"]])
    return all(word in haystack.lower() for word in text.lower().split())


# installing

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
    if name.startswith(sys.argv[1]) and name not in dists:  # the first one found is the one imported
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
    done = _run([python, "-c", _INSPECT, PREFIX], what=f"inspecting {python}")
    data = orjson.loads(done.stdout)
    return Target(python, data["environment"], data["dists"])


async def _versions(
    url: str, name: str
) -> tuple[list[Version], set[Version], dict[Version, str], dict[Version, dict[str, HubFile]]]:
    """A project's versions on the hub, the yanked ones, one metadata URL per version, and its files."""
    page_url = urljoin(url, f"simple/{name}/")
    try:
        data = orjson.loads(await _request("GET", page_url, headers={"Accept": JSON_TYPE}))
    except HubError as exc:
        if " 404 " in str(exc):
            raise HubError(f"{name} is not on the hub at {url}") from None
        raise
    versions: set[Version] = set()
    yanked: set[Version] = set()
    metadata: dict[Version, str] = {}
    files: dict[Version, dict[str, HubFile]] = {}
    for f in data["files"]:
        filename = f["filename"]
        try:
            version = (
                parse_wheel_filename(filename)[1]
                if filename.endswith(".whl")
                else parse_sdist_filename(filename)[1]
            )
        except ValueError:
            continue
        versions.add(version)
        if f.get("yanked"):
            yanked.add(version)
        file_url = urljoin(page_url, f["url"]).partition("#")[0]
        if f.get("core-metadata") and (filename.endswith(".whl") or version not in metadata):
            metadata[version] = file_url + ".metadata"
        if sha256 := (f.get("hashes") or {}).get("sha256"):
            files.setdefault(version, {})[filename] = HubFile(name, str(version), filename, file_url, sha256)
    return sorted(versions), yanked, metadata, files


async def plan_install(url: str, requirement: str, *, environment: dict[str, str] | None = None) -> Plan:
    """Resolve ``requirement`` (an env name or project, optionally with a version specifier) on the hub.

    ``environment`` is the target interpreter's marker environment (this one's if ``None``).
    """
    try:
        first = Requirement(requirement)
    except InvalidRequirement as exc:
        raise HubError(
            f"{requirement!r} is not a requirement such as tictactoe or tictactoe==0.1.0: {exc}"
        ) from None
    first.name = project_name(first.name)
    pinned: dict[str, str] = {}
    files: dict[str, dict[str, HubFile]] = {}
    others: list[str] = []
    todo = [first]
    while todo:
        req = todo.pop()
        name = str(canonicalize_name(req.name))
        if name in pinned:
            continue
        versions, yanked, metadata, found = await _versions(url, name)
        exact = {str(s.version) for s in req.specifier if s.operator in ("==", "===")}
        allowed = [
            v
            for v in versions
            if req.specifier.contains(v, prereleases=True) and (v not in yanked or str(v) in exact)
        ]
        stable = [v for v in allowed if not v.is_prerelease] or allowed
        if not stable:
            raise HubError(f"no version of {name} on the hub matches {str(req.specifier) or 'any'} "
                           f"(versions: {', '.join(map(str, versions)) or 'none'}; yanked: {len(yanked)})")  # fmt: skip
        version = stable[-1]
        pinned[name] = str(version)
        files[name] = found.get(version, {})
        if version not in metadata:
            continue
        meta = BytesParser(policy=compat32).parsebytes(await _request("GET", metadata[version]))
        for line in meta.get_all("Requires-Dist") or []:
            dep = Requirement(line)
            if dep.marker is not None and not dep.marker.evaluate({**(environment or {}), "extra": ""}):
                continue
            if str(canonicalize_name(dep.name)).startswith(PREFIX):
                todo.append(dep)
            else:
                others.append(line)
    hub = tuple(f"{n}=={v}" for n, v in pinned.items())
    return Plan(hub=hub, others=tuple(dict.fromkeys(others)), files=files)


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
        if name not in planned and dist != before.dists.get(name):
            raise HubError(
                f"pip installed {name} {dist['version']} from outside the hub, as a dependency of a "
                f"package from pip's own index: remove it with {python} -m pip uninstall {name}"
            )


def install(url: str, requirement: str, *, python: str = sys.executable, no_deps: bool = False,
            dry_run: bool = False) -> list[PipCommand]:  # fmt: skip
    """Install an environment from the hub; returns the pip commands (run unless ``dry_run``).

    The hub's packages are installed from the exact files the hub lists, checked by sha256, whatever
    pip's configuration says; the other dependencies from pip's own index. After pip, every
    ``palaestra-env-*`` distribution in ``python`` is checked: the hub's, or as it was before.
    """
    from palaestra.runner import run_async

    before = inspect_target(python)
    plan = run_async(plan_install(url, requirement, environment=before.environment))
    files = choose_files(url, plan, python)
    commands = install_commands(files, () if no_deps else plan.others, python)
    if not dry_run:
        for command in commands:
            _run(command.argv, env=command.env())
        verify(before, files)
    return commands


# writing


async def attach_results(url: str, token: str, run_dir: Path, *, with_report: bool = True) -> dict[str, Any]:
    """Attach a saved run's summary, and its HTML report, to its environment's page."""
    from palaestra.eval.report import render_report
    from palaestra.eval.store import RunStore, load_run

    run = RunStore.open(run_dir).read_metadata()
    if run.status != "complete":
        raise HubError(
            f"{run_dir}: the run is {run.status}, not complete: finish it with palaestra eval --resume"
        )
    form = aiohttp.FormData()
    form.add_field("run", orjson.dumps(run.to_dict()).decode(), content_type="application/json")
    if with_report:
        saved = load_run(run_dir)
        saved.path = (
            Path(saved.path.name) if saved.path else None
        )  # the run's folder, not the uploader's disk
        form.add_field(
            "report", render_report([saved]).encode(), filename="report.html", content_type="text/html"
        )
    body = await _request("POST", urljoin(url, "api/results"), token=token, data=form)
    answer: dict[str, Any] = orjson.loads(body)
    answer["url"] = urljoin(url, answer["url"])
    return answer


async def set_yanked(
    url: str, token: str, name: str, version: str, *, reason: str = "", undo: bool = False
) -> None:
    try:
        version = str(Version(version))
    except InvalidVersion:
        raise HubError(f"{version!r} is not a version") from None
    body = {"name": project_name(name), "version": version, "yanked": not undo, "reason": reason}
    await _request("POST", urljoin(url, "api/yank"), token=token, data=orjson.dumps(body),
                   headers={"Content-Type": "application/json"})  # fmt: skip

"""Talking to a hub: publish, search, read its index, attach results, yank.

The hub is found from ``--hub URL`` or ``PALAESTRA_HUB_URL``; write calls send the API token in
``PALAESTRA_HUB_TOKEN``. Uploads use the form ``twine`` sends, so ``twine upload
--repository-url HUB/legacy/`` works as well. Installing is ``palaestra.hub.install``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import aiohttp
import orjson
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from palaestra.hub.dist import ENTRY_POINT_GROUP, PREFIX, DistError, check_project_name
from palaestra.hub.index import HTML_TYPE, JSON_TYPE

URL_VAR = "PALAESTRA_HUB_URL"
TOKEN_VAR = "PALAESTRA_HUB_TOKEN"
TIMEOUT = aiohttp.ClientTimeout(total=600, connect=10)


class HubError(Exception):
    """A hub call that failed; the message is one line for the user (``status``: the HTTP one, if any)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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


async def fetch(method: str, url: str, *, token: str | None = None, **kwargs: Any) -> tuple[bytes, str]:
    """One call to the hub: the body of its answer and its media type; ``HubError`` for any failure."""
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
                # the hub's refusals are a line of text; a proxy's error page is HTML: its reason only
                text = "" if "html" in response.content_type else body.decode("utf-8", errors="replace")
                text = " ".join(text.split())[:500] or response.reason or ""
                raise HubError(f"{method} {url}: {response.status} {text}", status=response.status)
            return body, response.content_type
    except aiohttp.ClientError as exc:
        raise HubError(f"cannot reach the hub at {url}: {' '.join(str(exc).split())}") from None
    except TimeoutError:
        raise HubError(f"the hub at {url} did not answer in time") from None


async def request(method: str, url: str, *, token: str | None = None, **kwargs: Any) -> bytes:
    """The body of the hub's answer to one call (see ``fetch``)."""
    return (await fetch(method, url, token=token, **kwargs))[0]


def _json(body: bytes, url: str, *keys: str) -> dict[str, Any]:
    """The JSON object the hub answered at ``url``, with ``keys`` in it; ``HubError`` if it is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not all(k in data for k in keys):
        raise HubError(f"{url} did not answer the JSON a hub sends: is it a palaestra hub?")
    return data


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
            target = urljoin(url, "legacy/")
            done.append(_json(await request("POST", target, token=token, data=form), target, "filename"))
    return done


async def check_token(url: str, token: str) -> str:
    """The user ``token`` belongs to on the hub; ``HubError`` (401/403) before any build if none."""
    target = urljoin(url, "api/token")
    try:
        body = await request("GET", target, token=token)
    except HubError as exc:
        if exc.status == 404:  # a hub older than this route: its upload checks the token
            return ""
        raise
    return str(_json(body, target, "user")["user"])


def publish(url: str, token: str, env_dir: Path, *, isolation: bool = True) -> list[dict[str, Any]]:
    """Check the folder and the token, then build the wheel and the sdist and upload them."""
    from palaestra.runner import run_async

    check_env_dir(env_dir)
    run_async(check_token(url, token))  # a wrong token is said before a minute of building
    with tempfile.TemporaryDirectory(prefix="palaestra-publish-") as tmp:
        paths = build(env_dir, Path(tmp), isolation=isolation)
        return run_async(upload(url, token, paths))


# reading


_PROJECT_KEYS = ("name", "version", "summary", "environments", "keywords")


async def projects(url: str) -> list[dict[str, Any]]:
    """Every project on the hub (works against a static export too)."""
    target = urljoin(url, "api/projects.json")
    found = _json(await request("GET", target), target, "projects")["projects"]
    if not isinstance(found, list) or not all(
        isinstance(p, dict) and all(k in p for k in _PROJECT_KEYS) for p in found
    ):
        raise HubError(f"{target} did not answer the JSON a hub sends: is it a palaestra hub?")
    return found


def matches(project: dict[str, Any], text: str) -> bool:
    haystack = " ".join([project["name"], project["summary"], *project["environments"], *project["keywords"]])
    return all(word in haystack.lower() for word in text.lower().split())


@dataclass(frozen=True)
class IndexFile:
    """One file of a project's page in the hub's simple index, read from PEP 691 JSON or PEP 503 HTML."""

    filename: str
    url: str  # absolute, without the fragment
    sha256: str  # "" if the index gives none
    yanked: bool  # PEP 592
    requires_python: str  # "" if any Python
    metadata: bool  # its core metadata is at url + ".metadata" (PEP 658, PEP 714)

    @property
    def version(self) -> Version | None:
        """The version in the file's name (PEP 427, PEP 625); ``None`` if the name is not one."""
        try:
            if self.filename.endswith(".whl"):
                return parse_wheel_filename(self.filename)[1]
            return parse_sdist_filename(self.filename)[1]
        except ValueError:  # InvalidWheelFilename, InvalidSdistFilename
            return None


# PEP 691: JSON from a hub; HTML from a static copy of one, whose web server has only that
_ACCEPT = f"{JSON_TYPE}, {HTML_TYPE};q=0.2, text/html;q=0.1"


class _Links(HTMLParser):
    """The attributes of each ``<a>`` element of a PEP 503 page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


def _html_files(body: bytes, page_url: str) -> list[IndexFile]:
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    parser.close()
    out = []
    for attrs in parser.links:
        if not (href := attrs.get("href")):
            continue
        url, _, fragment = urljoin(page_url, href).partition("#")
        algorithm, _, digest = fragment.partition("=")
        metadata = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        out.append(
            IndexFile(
                unquote(urlsplit(url).path.rpartition("/")[2]),  # the link's text is the same name
                url,
                digest if algorithm == "sha256" else "",
                "data-yanked" in attrs,
                attrs.get("data-requires-python") or "",
                metadata not in (None, "false"),
            )
        )
    return out


def _json_files(body: bytes, page_url: str) -> list[IndexFile]:
    try:
        return [
            IndexFile(
                str(f["filename"]),
                urljoin(page_url, str(f["url"])).partition("#")[0],
                str((f.get("hashes") or {}).get("sha256") or ""),
                bool(f.get("yanked")),
                str(f.get("requires-python") or ""),
                bool(f.get("core-metadata") or f.get("dist-info-metadata")),
            )
            for f in _json(body, page_url, "files")["files"]
        ]
    except (KeyError, TypeError, AttributeError):
        raise HubError(f"{page_url} is not a package index page: its list of files cannot be read") from None


async def index_files(url: str, name: str) -> list[IndexFile]:
    """Every file of project ``name`` that the hub's simple index lists, from a hub or a static copy."""
    page_url = urljoin(url, f"simple/{name}/")
    try:
        body, media = await fetch("GET", page_url, headers={"Accept": _ACCEPT})
    except HubError as exc:
        if exc.status == 404:
            raise HubError(f"{name} is not on the hub at {url}") from None
        raise
    if media.endswith("json"):
        files = _json_files(body, page_url)
    elif media in ("text/html", HTML_TYPE):
        files = _html_files(body, page_url)
    else:
        raise HubError(f"{page_url} answered {media or 'no media type'}, not a package index page")
    if not files:
        raise HubError(f"{page_url} lists no files of {name}: is {url} a hub, or a copy of one?")
    return files


# writing


async def attach_results(
    url: str, token: str, run_dir: Path, *, with_report: bool = True, model_name: str | None = None
) -> dict[str, Any]:
    """Attach a saved run's summary, and its HTML report, to its environment's page.

    The model is shown as ``model_name``, else as ``public_model_name`` makes it (a local
    checkpoint's path becomes ``local:RUN/step-N``); neither copy names the endpoint or its key."""
    from palaestra.eval.report import render_report
    from palaestra.eval.store import RunStore, load_run
    from palaestra.hub.results import public_model_name

    run = RunStore.open(run_dir).read_metadata()
    if run.status != "complete":
        raise HubError(
            f"{run_dir}: the run is {run.status}, not complete: finish it with palaestra eval --resume"
        )
    shown = model_name or public_model_name(run.model)
    run = dataclasses.replace(run, model=shown, base_url=None, api_key_var=None)
    form = aiohttp.FormData()
    form.add_field("run", orjson.dumps(run.to_dict()).decode(), content_type="application/json")
    if with_report:
        saved = load_run(run_dir)
        saved.path = (
            Path(saved.path.name) if saved.path else None
        )  # the run's folder, not the uploader's disk
        saved.metadata = dataclasses.replace(saved.metadata, model=shown, base_url=None, api_key_var=None)
        form.add_field(
            "report", render_report([saved]).encode(), filename="report.html", content_type="text/html"
        )
    target = urljoin(url, "api/results")
    answer = _json(await request("POST", target, token=token, data=form), target, "url", "project")
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
    await request(
        "POST",
        urljoin(url, "api/yank"),
        token=token,
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json"},
    )

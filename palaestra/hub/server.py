"""``palaestra hub serve``: the hub as an aiohttp app over a data folder.

Routes:
- ``/simple/`` and ``/simple/NAME/``: the package index, PEP 503 HTML or PEP 691 JSON by the
  ``Accept`` header (or ``?format=``), with sha256 hashes, PEP 592 yanks and PEP 658 metadata,
  so ``pip install --index-url HUB/simple/`` and ``uv`` need nothing from palaestra;
- ``/files/NAME/FILE`` (and ``FILE.metadata``): the distributions;
- ``POST /legacy/``: uploads in the form ``twine`` sends, authenticated by an API token (as
  ``__token__`` with Basic auth, or ``Authorization: Bearer``);
- ``POST /api/yank``, ``POST /api/results``, ``GET /api/projects.json``;
- ``/`` and ``/env/NAME/``: the pages; ``/results/ID/report.html``: an attached run's report.

The data folder it serves (the catalog, the files, the clean-up after a crash) is ``data.HubData``.

Every response says ``X-Content-Type-Options: nosniff`` and has a Content-Security-Policy: the
pages' allows only ``hub.js``; a report runs sandboxed in an opaque origin; everything else, the
uploaded files first, is sandboxed with nothing allowed, and a distribution is an attachment. A
malformed request gets a 4xx with a message, never a 500.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from packaging.version import Version

from palaestra.hub import forms, index, pages
from palaestra.hub.catalog import User
from palaestra.hub.data import HubData
from palaestra.hub.database import CatalogError
from palaestra.hub.dist import FRAMEWORK, DistError, DistInfo, inspect_dist, normalize
from palaestra.hub.results import ResultError, run_record
from palaestra.serve import serve_until_signal

logger = logging.getLogger("palaestra.hub")
MAX_UPLOAD_BYTES = 100 * 1024 * 1024
MAX_CACHED_PAGES = 1024
MAX_CACHE_BYTES = 64 * 1024 * 1024
MAX_REASON = 1000  # a yank's reason, shown on the pages and in the index
PAGE_HEADERS = {"Content-Security-Policy": pages.PAGE_CSP}
# an attached report is the uploader's HTML: it runs in an opaque origin, with no network access
REPORT_HEADERS = {
    "Content-Security-Policy": "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'",
}
# anything else, and an uploaded file above all, is no document to run: sandboxed, nothing allowed
DEFAULT_CSP = "default-src 'none'; sandbox; frame-ancestors 'none'"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # what a redirect to a project's normal name may come from


def _token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        try:
            _user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or None
    return None


def _error(status: int, message: str) -> web.Response:
    # twine shows the reason phrase (printable ASCII only: it is a header); pip and palaestra read the body
    reason = re.sub(r"[^\x20-\x7e]", "?", (message.splitlines() or [""])[0])[:200] or "error"
    body = (message + "\n").encode("utf-8", "backslashreplace")  # a name from an archive may hold surrogates
    return web.Response(status=status, body=body, reason=reason, content_type="text/plain", charset="utf-8")


class HubServer:
    """The request handlers over one data folder."""

    def __init__(self, data: HubData, *, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> None:
        self.data = data
        self.max_upload_bytes = max_upload_bytes
        self._cache: dict[tuple[str, str], tuple[bytes, str]] = {}
        self._cache_bytes = 0
        self._generation = 0  # bumped by every write: a page read before it is not cached after it
        self._projects_of_files: dict[str, str] = {}  # filename -> project, for downloads

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _user(self, request: web.Request) -> User:
        user: User = await self._run(self.data.catalog.authenticate, _token(request))
        return user

    async def upload(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        fields = {":action", "sha256_digest", "name"}
        async with forms.form(
            request,
            self.data.tmp,
            text_fields=fields,
            file_fields={"content"},
            max_bytes=self.max_upload_bytes,
        ) as form:
            action = form.fields.get(":action", "file_upload")
            if action != "file_upload":
                raise CatalogError(400, f"unsupported :action {action[:100]!r}")
            if "content" not in form.files:
                raise CatalogError(400, "no file: send it as the multipart field 'content'")
            filename, tmp = form.files["content"]
            dist: DistInfo = await self._run(inspect_dist, tmp, filename=filename)
            claimed = form.fields.get("sha256_digest")
            if claimed and claimed.lower() != dist.sha256:
                raise CatalogError(
                    400, f"sha256_digest {claimed[:100]} does not match the file received ({dist.sha256})"
                )
            name = form.fields.get("name")
            if name and normalize(name) != dist.name:
                raise CatalogError(400, f"the form names {name[:100]!r}, the file {dist.name!r}")
            await self._run(self.data.store, user, dist, tmp)
        self.changed()
        logger.info("%s uploaded %s", user.name, dist.filename)
        return web.json_response({"filename": dist.filename, "name": dist.name, "version": dist.version})

    async def whoami(self, request: web.Request) -> web.Response:
        """The token's user: what ``palaestra hub publish`` asks before it builds anything."""
        user = await self._user(request)
        return web.json_response({"user": user.name})

    async def yank(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        body = await forms.json_object(
            request,
            {"name": str, "version": str, "yanked": bool, "reason": str},
            required={"name", "version"},
        )
        name, version = normalize(body["name"]), body["version"]
        with contextlib.suppress(ValueError):  # InvalidVersion, or a number too long for int()
            version = str(Version(version))
        yanked, reason = body.get("yanked", True), body.get("reason", "")
        if len(reason) > MAX_REASON:
            raise CatalogError(400, f"field 'reason' is over {MAX_REASON} characters")
        await self._run(self.data.catalog.set_yanked, user, name, version, yanked=yanked, reason=reason)
        self.changed()
        return web.json_response({"name": name, "version": version, "yanked": yanked})

    async def add_results(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        async with forms.form(
            request,
            self.data.tmp,
            text_fields={"run"},
            file_fields={"report"},
            max_bytes=self.max_upload_bytes,
        ) as form:
            try:
                run = run_record(orjson.loads(form.fields.get("run", "null")))
            except (orjson.JSONDecodeError, ResultError) as exc:
                raise CatalogError(400, f"not a saved run's metadata.json: {exc}") from None
            catalog = self.data.catalog
            project = await self._run(catalog.project_for_env, run["env_id"])
            if project is None:
                raise CatalogError(
                    404, f"no environment named {run['env_id']!r} on this hub: publish its package first"
                )
            report = form.files.get("report")
            result_id: int = await self._run(
                catalog.add_result, user, project, run, has_report=report is not None
            )
            if report is not None:
                os.replace(report[1], self.data.reports / f"{result_id}.html")
        self.changed()
        return web.json_response({"id": result_id, "project": project, "url": f"env/{project}/#results"})

    # reading

    def changed(self) -> None:
        """Forget the rendered pages (a write happened)."""
        self._generation += 1
        self._cache.clear()
        self._cache_bytes = 0

    async def _cached(
        self,
        key: tuple[str, str],
        render: Callable[[], Awaitable[tuple[bytes, str] | None]],
        finish: Callable[[bytes], bytes] | None = None,
    ) -> web.Response:
        hit = self._cache.get(key)
        if hit is None:
            generation = self._generation
            hit = await render()
            if hit is None:
                raise web.HTTPNotFound(text=f"not found: {key[1]}\n")
            # search strings are unbounded; so is not this cache, in entries or in bytes
            if len(self._cache) >= MAX_CACHED_PAGES or self._cache_bytes + len(hit[0]) > MAX_CACHE_BYTES:
                self._cache.clear()
                self._cache_bytes = 0
            if generation == self._generation:  # no write finished while it rendered
                self._cache[key] = hit
                self._cache_bytes += len(hit[0])
        body, content_type = hit
        if finish is not None:
            body = finish(body)
        headers = PAGE_HEADERS if content_type.startswith("text/html") and key[0] == "page" else {}
        return web.Response(body=body, headers={"Content-Type": content_type, **headers})

    async def simple_root(self, request: web.Request) -> web.Response:
        kind = index.negotiate(request.headers.get("Accept", ""), request.query.get("format"))
        if kind is None:
            raise web.HTTPNotAcceptable(text="this index serves PEP 691 JSON and PEP 503 HTML\n")

        async def render() -> tuple[bytes, str]:
            projects = await self._run(self.data.catalog.projects)
            return index.root(projects, kind)

        return await self._cached(("simple", f"/{kind}"), render)

    async def simple_project(self, request: web.Request) -> web.Response:
        raw = request.match_info["name"]
        name = normalize(raw)
        if not _NAME.fullmatch(raw):
            raise web.HTTPNotFound(text=f"no project {raw[:100]!r}\n")
        if raw != name or not request.path.endswith("/"):
            raise web.HTTPMovedPermanently(f"../{name}/" if request.path.endswith("/") else f"{name}/")
        kind = index.negotiate(request.headers.get("Accept", ""), request.query.get("format"))
        if kind is None:
            raise web.HTTPNotAcceptable(text="this index serves PEP 691 JSON and PEP 503 HTML\n")

        async def render() -> tuple[bytes, str] | None:
            project = await self._run(self.data.catalog.project, name)
            return None if project is None else index.project(project, kind)

        return await self._cached(("simple", f"{name}/{kind}"), render)

    async def file(self, request: web.Request) -> web.StreamResponse:
        name, filename = request.match_info["name"], request.match_info["filename"]
        listed = filename.removesuffix(".metadata")
        project = self._projects_of_files.get(listed)
        if project is None:  # files never change once listed, so a lookup is remembered
            row = await self._run(self.data.catalog.file, listed)
            if row is not None:
                project = self._projects_of_files[listed] = row["project"]
        if project != name:
            raise web.HTTPNotFound(text=f"no file {filename}\n")
        path = self.data.path(name, filename)
        plain = re.sub(r"[^A-Za-z0-9._+!-]", "_", filename)
        headers = {
            "Cache-Control": "max-age=31536000, immutable",
            # a download, never a page or a script of this origin, whatever its bytes look like
            "Content-Disposition": f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename, safe='')}",
        }
        if filename.endswith(".metadata"):  # small: one read beats a streamed response
            body = await self._run(path.read_bytes)
            return web.Response(body=body, headers={**headers, "Content-Type": "text/plain; charset=utf-8"})
        return web.FileResponse(path, headers={**headers, "Content-Type": "application/octet-stream"})

    async def projects_json(self, request: web.Request) -> web.Response:
        async def render() -> tuple[bytes, str]:
            projects = await self._run(self.data.catalog.projects)
            return pages.projects_json(projects), "application/json"

        return await self._cached(("api", "projects"), render)

    async def home(self, request: web.Request) -> web.Response:
        query, tag = request.query.get("q", "")[:200], request.query.get("tag", "")[:100]

        async def render() -> tuple[bytes, str]:
            projects, results = await self._run(self._listing)
            return pages.home(projects, results, query=query, tag=tag).encode(), "text/html; charset=utf-8"

        return await self._cached(("page", f"/?q={query}&tag={tag}"), render)

    def _listing(self) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        catalog = self.data.catalog
        projects = catalog.projects()
        return projects, {p["name"]: catalog.results(p["name"]) for p in projects}

    async def env_page(self, request: web.Request) -> web.Response:
        raw = request.match_info["name"]
        name = normalize(raw)
        if not _NAME.fullmatch(raw):
            raise web.HTTPNotFound(text=f"no environment {raw[:100]!r}\n")
        if raw != name or not request.path.endswith("/"):
            raise web.HTTPMovedPermanently(f"/env/{name}/")
        hub_url = f"{request.scheme}://{request.host}/"  # what the client asked for; shown escaped

        async def render() -> tuple[bytes, str] | None:
            project = await self._run(self.data.catalog.project, name)
            if project is None:
                return None
            results = await self._run(self.data.catalog.results, name)
            framework = await self._run(self.data.catalog.project, FRAMEWORK)
            wheel = pages.palaestra_wheel(framework)
            page = pages.project(project, results, hub_url=None, palaestra_wheel=wheel)
            return page.encode(), "text/html; charset=utf-8"

        # one rendering whatever the Host header: a client cannot make the hub render a README per host
        return await self._cached(
            ("page", f"env/{name}"), render, lambda page: pages.with_hub_url(page, hub_url)
        )

    async def report(self, request: web.Request) -> web.StreamResponse:
        path = self.data.reports / f"{int(request.match_info['id'])}.html"  # the route takes 1 to 18 digits
        if not path.is_file():
            raise web.HTTPNotFound(text="no such report\n")
        return web.FileResponse(path, headers={**REPORT_HEADERS, "Content-Type": "text/html; charset=utf-8"})

    async def asset(self, request: web.Request) -> web.Response:
        found = pages.asset(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound(text="no such file\n")
        return web.Response(body=found[0], headers={"Content-Type": found[1], "Cache-Control": "max-age=300"})


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except CatalogError as exc:
        return _error(exc.status, str(exc))
    except DistError as exc:
        return _error(400, str(exc))
    except HttpProcessingError as exc:  # a body that breaks HTTP itself (cut short, a line too long)
        return _error(400, f"malformed request: {exc.message}")
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except web.HTTPException:
        raise
    except Exception:
        logger.exception("error serving %s %s", request.method, request.path)
        return _error(500, "internal error (the hub's log has the details)")


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """What every response says, whichever handler (or aiohttp itself) made it."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Content-Security-Policy", DEFAULT_CSP)
    response.headers.setdefault("Referrer-Policy", "same-origin")


def create_app(data: HubData, *, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> web.Application:
    """The hub app over ``data`` (whose leftovers from a crash are removed first)."""
    removed = data.recover()
    if removed:
        logger.warning("removed %d files left by an interrupted upload", len(removed))
    server = HubServer(data, max_upload_bytes=max_upload_bytes)
    # the body is streamed by the upload handlers, which count it against the limit themselves
    app = web.Application(middlewares=[_errors], client_max_size=max_upload_bytes)
    app.on_response_prepare.append(_secure_headers)
    routes = [
        web.get("/", server.home),
        web.get("/simple/", server.simple_root),
        web.get("/simple/{name}", server.simple_project),
        web.get("/simple/{name}/", server.simple_project),
        web.get("/files/{name}/{filename}", server.file),
        web.post("/legacy/", server.upload),
        web.post("/legacy", server.upload),
        web.post("/api/yank", server.yank),
        web.get("/api/token", server.whoami),
        web.post("/api/results", server.add_results),
        web.get("/api/projects.json", server.projects_json),
        web.get("/env/{name}", server.env_page),
        web.get("/env/{name}/", server.env_page),
        web.get("/results/{id:\\d{1,18}}/report.html", server.report),
        web.get("/static/{name}", server.asset),
    ]
    app.add_routes(routes)
    return app


def serve(
    data_dir: Path, *, host: str = "127.0.0.1", port: int = 8080, max_upload_bytes: int = MAX_UPLOAD_BYTES
) -> None:
    """Serve the hub over ``data_dir`` until SIGINT/SIGTERM; port 0 picks a free port."""
    logging.basicConfig(level=logging.INFO, format="palaestra hub: %(levelname)s: %(message)s")
    app = create_app(HubData(data_dir), max_upload_bytes=max_upload_bytes)
    serve_until_signal(app, host, port, lambda url: f"hub serving {data_dir} at {url.removesuffix('v1')}")

"""The simple repository API: PEP 503 HTML and PEP 691 JSON, from the catalog's records.

Links are relative (``../../files/NAME/FILE``), so the same pages work served by the hub and
exported to any static web server. Each file carries its sha256 (in the URL fragment for HTML,
``hashes`` for JSON), ``requires-python``, its yank (PEP 592) and the hash of its core metadata,
served beside each wheel as ``FILE.metadata`` (PEP 658/714): pip then resolves without downloading wheels.
"""

from __future__ import annotations

import html
from typing import Any, Literal
from urllib.parse import quote

import orjson

Kind = Literal["json", "html"]
API_VERSION = "1.1"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
_OFFERED: dict[str, Kind] = {
    JSON_TYPE: "json",
    HTML_TYPE: "html",
    "text/html": "html",
    "*/*": "html",
    "application/*": "json",
    "text/*": "html",
}


def negotiate(accept: str, format_param: str | None = None) -> Kind | None:
    """The representation to send for an ``Accept`` header (PEP 691); ``None``: nothing acceptable.

    ``?format=`` (one media type) overrides the header, as PEP 691 allows.
    """
    if format_param:
        return _OFFERED.get(format_param.strip())
    if not accept.strip():
        return "html"
    best: tuple[float, int, Kind] | None = None
    for position, item in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in item.split(";"))
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        kind = _OFFERED.get(media.lower())
        if kind is not None and quality > 0 and (best is None or (quality, -position) > best[:2]):
            best = (quality, -position, kind)
    return best[2] if best else None


def _page(title: str, body: str) -> bytes:
    return (
        f'<!DOCTYPE html>\n<html>\n<head>\n<meta name="pypi:repository-version" content="{API_VERSION}">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}</body>\n</html>\n"
    ).encode()


def root(projects: list[dict[str, Any]], kind: Kind) -> tuple[bytes, str]:
    """``/simple/``: every project."""
    if kind == "json":
        body = {
            "meta": {"api-version": API_VERSION},
            "projects": [{"name": p["display_name"]} for p in projects],
        }
        return orjson.dumps(body), JSON_TYPE
    links = "".join(
        f'<a href="{html.escape(url_part(p["name"]))}/">{html.escape(p["display_name"])}</a>\n'
        for p in projects
    )
    return _page("Simple index", links), HTML_TYPE


def url_part(value: str) -> str:
    """One path segment of a link, percent-encoded (a valid file or project name stays as it is)."""
    return quote(value, safe="+!")


def _yank(release: dict[str, Any]) -> bool | str:
    if not release["yanked"]:
        return False
    return release["yanked_reason"] or True


def project(project: dict[str, Any], kind: Kind) -> tuple[bytes, str]:
    """``/simple/NAME/``: every file of every release."""
    name = project["name"]
    files = [(release, f) for release in project["releases"] for f in release["files"]]
    if kind == "json":
        entries = []
        for release, f in files:
            metadata = {"sha256": f["metadata_sha256"]} if f["kind"] == "wheel" else False
            entries.append(
                {
                    "filename": f["filename"],
                    "url": f"../../files/{url_part(name)}/{url_part(f['filename'])}",
                    "hashes": {"sha256": f["sha256"]},
                    "requires-python": f["requires_python"] or None,
                    "core-metadata": metadata,
                    "dist-info-metadata": metadata,  # the PEP 658 spelling, for older clients
                    "yanked": _yank(release),
                    "size": f["size"],
                    "upload-time": f["uploaded_at"].replace("Z", ".000000Z"),
                }
            )
        body = {
            "meta": {"api-version": API_VERSION},
            "name": name,
            "versions": [r["version"] for r in project["releases"]],
            "files": entries,
        }
        return orjson.dumps(body), JSON_TYPE
    links = []
    for release, f in files:
        url = f"../../files/{url_part(name)}/{url_part(f['filename'])}#sha256={f['sha256']}"
        attrs = [f'href="{html.escape(url)}"']
        if f["requires_python"]:
            attrs.append(f'data-requires-python="{html.escape(f["requires_python"])}"')
        if f["kind"] == "wheel":  # an sdist's PKG-INFO may leave fields dynamic: not offered
            attrs.append(f'data-dist-info-metadata="sha256={f["metadata_sha256"]}"')
            attrs.append(f'data-core-metadata="sha256={f["metadata_sha256"]}"')
        yank = _yank(release)
        if yank is not False:
            attrs.append(f'data-yanked="{html.escape(yank if isinstance(yank, str) else "")}"')
        links.append(f"<a {' '.join(attrs)}>{html.escape(f['filename'])}</a>\n")
    return _page(f"Links for {name}", "".join(links)), HTML_TYPE

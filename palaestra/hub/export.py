"""``palaestra hub export DIR``: the whole hub as static files, for any static web server.

The layout is the served one (``simple/NAME/index.html``, ``files/``, ``env/NAME/index.html``,
``api/projects.json``), so ``pip install --index-url URL/simple/`` works against a plain file
server, read-only. The index is PEP 503 HTML only (a static server cannot negotiate JSON); core
metadata files are exported beside the wheels. An attached report is embedded in a sandboxed
frame (no same-origin access), since a static host cannot send the sandboxing header the hub does;
its page's policy, which the frame inherits, gives it no network access. The pages carry their own
policy (``pages.META_CSP``): on any host, the one script they run is ``hub.js``.
"""

from __future__ import annotations

import html
import os
import shutil
from pathlib import Path

from palaestra.hub import index, pages
from palaestra.hub.data import HubData
from palaestra.hub.dist import FRAMEWORK

REPORT_WRAPPER = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Run report</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; \
style-src 'unsafe-inline'; img-src data:; frame-src 'self'; base-uri 'none'; form-action 'none'">
<style>html, body, iframe {{ margin: 0; border: 0; width: 100%; height: 100%; }}</style></head>
<body><iframe sandbox="allow-scripts" srcdoc="{srcdoc}"></iframe></body></html>
"""


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)  # files never change once published: a hard link is a safe copy
    except OSError:
        shutil.copyfile(source, target)


def export(data: HubData, out: Path, *, hub_url: str = "") -> int:
    """Write the static hub into ``out`` (which must be empty or absent); returns the files written.

    ``hub_url`` is the address it will be served at, shown in the install lines of its pages.
    """
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty: export into a new folder")
    catalog = data.catalog
    projects = catalog.projects()
    attached = {}
    written = 0
    url = hub_url.rstrip("/") + "/" if hub_url else "HUB_URL/"
    body, _ = index.root(projects, "html")
    _write(out / "simple" / "index.html", body)
    wheel = pages.palaestra_wheel(catalog.project(FRAMEWORK))
    for summary in projects:
        name = summary["name"]
        project = catalog.project(name)
        assert project is not None  # listed a moment ago; the hub never deletes
        body, _ = index.project(project, "html")
        _write(out / "simple" / name / "index.html", body)
        for release in project["releases"]:
            for f in release["files"]:
                for filename in (f["filename"], f["filename"] + ".metadata"):
                    _copy(data.path(name, filename), out / "files" / name / filename)
                    written += 1
        results = catalog.results(name)
        attached[name] = results
        page = pages.project(project, results, hub_url=url, palaestra_wheel=wheel)
        _write(out / "env" / name / "index.html", page)
        for run in results:
            report = data.reports / f"{run['id']}.html"
            if run["has_report"] and report.is_file():
                srcdoc = html.escape(report.read_text(encoding="utf-8", errors="replace"), quote=True)
                _write(out / "results" / str(run["id"]) / "report.html", REPORT_WRAPPER.format(srcdoc=srcdoc))
                written += 1
        written += 2
    _write(out / "index.html", pages.home(projects, attached))
    _write(out / "api" / "projects.json", pages.projects_json(projects))
    for name in pages.ASSETS:
        found = pages.asset(name)
        assert found is not None
        _write(out / "static" / name, found[0])
    return written + 3 + len(pages.ASSETS)

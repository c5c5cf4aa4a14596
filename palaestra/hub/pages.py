"""The hub's browsable pages: the environment list and one page per environment.

Pages are plain HTML with relative links, so the hub serves them and ``palaestra hub export``
writes them for a static host unchanged. Everything an uploader wrote is escaped (in URLs, also
percent-encoded); a README is rendered by markdown-it with raw HTML off (tags show as text,
``javascript:`` links are dropped). Each page carries its Content-Security-Policy in a ``<meta>``
tag as well as the hub's header, so a static copy keeps it: the one script a page may run is
``hub.js``, by its sha256 (an uploaded file served from the same origin is no script to it).
Search and tag filters work without JavaScript on the server (``?q=``, ``?tag=``); ``hub.js``
filters the list as you type, and does the same on a static host.
"""

from __future__ import annotations

import base64
import hashlib
import html
from importlib.resources import files
from typing import Any
from urllib.parse import quote

import orjson
from markdown_it import MarkdownIt

from palaestra.hub.dist import FRAMEWORK
from palaestra.hub.index import url_part
from palaestra.hub.results import Board, leaderboards, reproduce_command

ASSETS = {"hub.css": "text/css; charset=utf-8", "hub.js": "text/javascript; charset=utf-8"}
_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])


def asset(name: str) -> tuple[bytes, str] | None:
    if name not in ASSETS:
        return None
    return files("palaestra.hub").joinpath("assets", name).read_bytes(), ASSETS[name]


def _integrity(name: str) -> str:
    found = asset(name)
    assert found is not None  # one of ASSETS
    return "sha256-" + base64.b64encode(hashlib.sha256(found[0]).digest()).decode()


SCRIPT_INTEGRITY = _integrity("hub.js")
# a page runs hub.js and nothing else: not an inline script, not another file of the same origin
META_CSP = (
    f"default-src 'none'; style-src 'self'; script-src '{SCRIPT_INTEGRITY}'; img-src 'self' https: data:; "
    "form-action 'self'; base-uri 'none'"
)
PAGE_CSP = META_CSP + "; frame-ancestors 'none'"  # as a header: <meta> cannot carry frame-ancestors


# where a page's install line takes the hub's address; escaped content cannot spell it (it has a "<")
HUB_URL = "<!--hub-url-->"


def with_hub_url(page: bytes, hub_url: str) -> bytes:
    """A page rendered with ``hub_url=None``, for a hub at ``hub_url``."""
    return page.replace(HUB_URL.encode(), esc(hub_url).encode())


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_readme(text: str, content_type: str) -> str:
    """A README as safe HTML: Markdown rendered without raw HTML, anything else as preformatted text."""
    if not text.strip():
        return "<p class=muted>No README.</p>"
    if content_type.split(";")[0].strip().lower() in ("text/markdown", "text/x-markdown", ""):
        return _markdown.render(text)
    return f"<pre>{esc(text)}</pre>"


def projects_json(projects: list[dict[str, Any]]) -> bytes:
    keys = (
        "name",
        "display_name",
        "version",
        "summary",
        "keywords",
        "environments",
        "owner",
        "updated_at",
        "yanked",
    )
    return orjson.dumps({"projects": [{k: p.get(k) for k in keys} for p in projects]})


def _layout(title: str, root: str, body: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{META_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>{esc(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{root}static/hub.css">
<script src="{root}static/hub.js" integrity="{SCRIPT_INTEGRITY}" defer></script>
</head>
<body>
<header><a class="brand" href="{root}">palaestra hub</a>
<form class="search" action="{root}" method="get" role="search">
<input type="search" name="q" id="q" placeholder="Search environments" aria-label="Search environments">
</form>
<a href="{root}simple/">simple index</a></header>
<main>
{body}
</main>
</body>
</html>
"""


def _tags(keywords: list[str], root: str) -> str:
    return "".join(
        f'<a class="tag" href="{root}?tag={esc(quote(k, safe=""))}">{esc(k)}</a>' for k in keywords
    )


def home(
    projects: list[dict[str, Any]],
    results: dict[str, list[dict[str, Any]]],
    *,
    query: str = "",
    tag: str = "",
) -> str:
    """The list of environments (with their attached results); ``query`` and ``tag`` filter it as the
    search box does."""
    cards = []
    n_visible = 0
    for p in projects:
        text = " ".join([p["name"], p["summary"], *p["environments"], *p["keywords"]]).lower()
        visible = (not query or all(word in text for word in query.lower().split())) and (
            not tag or tag in p["keywords"]
        )
        n_visible += visible
        runs = results.get(p["name"], [])
        summary = f"{len(runs)} eval result{'s' * (len(runs) != 1)}" if runs else "no eval results yet"
        if runs:
            best = max(runs, key=lambda r: r["reward"]["mean"] or 0.0)
            summary += f" · best {_fmt(best['reward']['mean'])} ({best['model']})"
        cards.append(
            f'<li class="card" data-text="{esc(text)}" data-tags="{esc(" ".join(p["keywords"]))}"'
            f"{'' if visible else ' hidden'}>"
            f'<h2><a href="env/{esc(p["name"])}/">{esc(p["display_name"])}</a> <span class="version">'
            f"{esc(p['version'])}</span></h2><p>{esc(p['summary'])}</p>"
            f'<p class="meta">environments: {esc(", ".join(p["environments"]))} · {esc(summary)} · '
            f"by {esc(p['owner'])}</p><p>{_tags(p['keywords'], '')}</p></li>"
        )
    all_tags = sorted({k for p in projects for k in p["keywords"]})
    filters = f'<p class="tags" id="tags">{_tags(all_tags, "")}</p>' if all_tags else ""
    empty = '<p class="muted" id="none" hidden>No environment matches.</p>'
    listing = (
        f'<ul class="cards" id="cards">{"".join(cards)}</ul>'
        if cards
        else ('<p class="muted">Nothing is published yet: <code>palaestra hub publish ENV_DIR</code>.</p>')
    )
    total = f"{len(projects)} environment{'s' * (len(projects) != 1)}"
    if n_visible < len(projects):
        total = f"{n_visible} of {len(projects)} environments"
    return _layout(
        "palaestra hub",
        "",
        f"<h1>Environments</h1><p class=muted id=count>{total}</p>{filters}{listing}{empty}",
    )


def palaestra_wheel(framework: dict[str, Any] | None) -> tuple[str, str] | None:
    """(file name, sha256) of the newest wheel of palaestra in its catalog entry, or None."""
    releases = (framework or {}).get("releases") or []
    for release in reversed([r for r in releases if not r["yanked"]] or releases):
        for f in release["files"]:
            if f["filename"].endswith(".whl"):
                return f["filename"], f["sha256"]
    return None


def install_lines(name: str, url: str, *, palaestra_wheel: tuple[str, str] | None) -> str:
    """The page's install commands for ``name`` (already escaped) on the hub at ``url`` (escaped).

    Every line takes the hub's packages from the hub only, palaestra itself as the exact file and
    sha256 the hub lists (never from an index that a squatter could win); the other dependencies
    come from pip's own index."""
    lines = [f"palaestra install {name} --hub {url}    # palaestra installed already"]
    if palaestra_wheel is not None:
        filename, sha256 = (esc(part) for part in palaestra_wheel)
        pin = f"{FRAMEWORK} @ {url}files/{FRAMEWORK}/{filename}#sha256={sha256}"
        bootstrap = f"pip install --no-deps &quot;{pin}&quot; &amp;&amp; pip install {FRAMEWORK}"
        if name == FRAMEWORK:
            lines = [bootstrap]
        else:
            note = "# no palaestra yet: palaestra from this hub, its dependencies from your index"
            lines[:0] = [note, bootstrap]
    lines.append(
        f"uv pip install --extra-index-url {url}simple/ {name}    # uv: the hub's names from the hub only"
    )
    return "<pre><code>" + "\n".join(lines) + "</code></pre>"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _sampling(run: dict[str, Any]) -> str:
    sampling = run.get("sampling") or {}
    shown = [
        f"{k}={sampling[k]}" for k in ("temperature", "top_p", "max_tokens") if sampling.get(k) is not None
    ]
    return ", ".join(shown) or "env default"


def _board(board: Board, root: str) -> str:
    names = board.metric_names
    args = orjson.dumps(board.env_args, option=orjson.OPT_SORT_KEYS).decode() if board.env_args else "default"
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    rows = []
    for rank, run in enumerate(board.runs, 1):
        low, high = run["reward"]["ci95"]
        report = (
            f'<a href="{root}results/{int(run["id"])}/report.html">report</a>' if run["has_report"] else "–"
        )
        cells = "".join(f"<td class=num>{_fmt(run['metrics'].get(n))}</td>" for n in names)
        rows.append(
            f"<tr><td class=num>{rank}</td><td><b>{esc(run['model'])}</b></td>"
            f"<td class=num><b>{_fmt(run['reward']['mean'])}</b></td><td class=num>[{_fmt(low)}, {_fmt(high)}]</td>"
            f"<td class=num>{esc(run['num_examples'])}×{esc(run['rollouts_per_example'])}</td>"
            f"<td>{esc(_sampling(run))}</td><td class=num>{esc(run['seed'])}</td><td>{esc(run['env_version'] or '?')}</td>"
            f"{cells}<td class=num>{esc(run['errors'])}</td><td>{esc(run['uploader'])}</td>"
            f"<td>{esc((run['finished_at'] or '')[:10])}</td>"
            f"<td>{report}</td><td><details><summary>command</summary><code>{esc(reproduce_command(run))}</code>"
            "</details></td></tr>"
        )
    return (
        f'<h3>{esc(board.env_id)} <span class="muted">arguments: <code>{esc(args)}</code></span></h3>'
        '<div class="scroll"><table class="board"><thead><tr><th>#</th><th>model</th><th>reward</th><th>95% CI</th>'
        f"<th>n×r</th><th>sampling</th><th>seed</th><th>env version</th>{head}<th>errors</th><th>by</th><th>date</th>"
        f"<th></th><th>reproduce</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def project(
    project: dict[str, Any],
    results: list[dict[str, Any]],
    *,
    hub_url: str | None,
    root: str = "../../",
    palaestra_wheel: tuple[str, str] | None = None,
) -> str:
    """One environment's page: install lines, README, leaderboards, versions, dependencies.

    ``hub_url`` ``None`` leaves ``HUB_URL`` in the install line, for ``with_hub_url`` to fill in: the
    hub renders a page once, whatever address it was asked at. ``palaestra_wheel`` (file name,
    sha256): the newest wheel of palaestra itself on the hub, so the page also says how to install
    on a machine that has no palaestra yet.
    """
    name = project["name"]
    releases = project["releases"]
    live = [r for r in releases if not r["yanked"]] or releases
    latest = live[-1]
    url = HUB_URL if hub_url is None else esc(hub_url)
    install = install_lines(name, url, palaestra_wheel=palaestra_wheel)
    boards = leaderboards(results)
    board_html = "".join(_board(b, root) for b in boards) or (
        "<p class=muted>No results yet. Attach one with <code>palaestra hub results RUN_DIR</code>.</p>"
    )
    versions = []
    for release in reversed(releases):
        files = ", ".join(
            f'<a href="{root}files/{esc(url_part(name))}/{esc(url_part(f["filename"]))}" download '
            f'title="sha256 {esc(f["sha256"])}">'
            f"{esc(f['kind'])}</a>"
            for f in release["files"]
        )
        yank = (
            f' <span class="yanked">yanked: {esc(release["yanked_reason"] or "no reason given")}</span>'
            * bool(release["yanked"])
        )
        versions.append(
            f"<tr><td>{esc(release['version'])}{yank}</td><td>{esc(release['created_at'][:10])}</td>"
            f"<td>{files}</td></tr>"
        )
    deps = "".join(f"<li><code>{esc(d)}</code></li>" for d in latest["requires_dist"]) or "<li>none</li>"
    defaults: dict[str, Any] = next((f["eval_defaults"] for f in latest["files"] if f["eval_defaults"]), {})
    defaults_html = (
        "<table>"
        + "".join(
            f"<tr><td><code>{esc(k)}</code></td><td><code>{esc(orjson.dumps(v).decode())}</code></td></tr>"
            for k, v in sorted(defaults.items())
        )
        + "</table>"
        if defaults
        else "<p class=muted>None declared (palaestra eval's own defaults apply).</p>"
    )
    links = "".join(
        f'<li>{esc(label)}: <a href="{esc(url)}" rel="nofollow noopener">{esc(url)}</a></li>'
        for label, url in latest["project_urls"]
        if url.startswith(("https://", "http://"))
    )
    side = (
        f"<h2>Install</h2>{install}<h2>Environments</h2><p>{esc(', '.join(latest['environments']))}</p>"
        f"<h2>Eval defaults</h2>{defaults_html}"
        f"<h2>Dependencies</h2><ul>{deps}</ul><p class=muted>Python {esc(latest['requires_python'] or 'any')}</p>"
        f"<h2>Versions</h2><table>{''.join(versions)}</table>"
        + (f"<h2>Links</h2><ul>{links}</ul>" if links else "")
        + f"<p class=muted>Owner: {esc(project['owner'])}"
        + (f" · license {esc(latest['license'])}" if latest["license"] else "")
        + "</p>"
    )
    body = (
        f'<h1>{esc(project["display_name"])} <span class="version">{esc(latest["version"])}</span></h1>'
        f"<p class=lead>{esc(latest['summary'])}</p><p>{_tags(latest['keywords'], root)}</p>"
        f'<section id="results"><h2>Leaderboard</h2>{board_html}</section>'
        f'<div class="columns"><article class="readme">{render_readme(latest["description"], latest["description_content_type"])}'
        f"</article><aside>{side}</aside></div>"
    )
    return _layout(f"{project['display_name']} · palaestra hub", root, body)

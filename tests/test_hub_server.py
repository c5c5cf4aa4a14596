"""The hub server in-process: the index pip reads, uploads and every refusal, yanks, pages, results."""

from __future__ import annotations

import base64
import hashlib
import html
import shutil
import sqlite3
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from palaestra.hub import index, pages
from palaestra.hub.catalog import Catalog
from palaestra.hub.client import HubError, attach_results, projects, set_yanked, upload
from palaestra.hub.data import HubData
from palaestra.hub.database import MIGRATIONS, CatalogError
from palaestra.hub.export import export
from palaestra.hub.install_plan import plan_install
from palaestra.hub.results import RECORD_KEYS
from palaestra.testing.hub import build_dists, running_hub, write_env_package

JSON = index.JSON_TYPE
INJECTION = (
    "# Echo\n\n<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n"
    "[click](javascript:alert(3))\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Wheels and sdists, built once: two versions, another project, and packages the hub refuses."""
    root = tmp_path_factory.mktemp("dists")
    made = {
        "v1": write_env_package(root, version="0.1.0", readme=INJECTION),
        "v2": write_env_package(root, version="0.2.0"),
        "other": write_env_package(root, name="palaestra-env-maze", module="maze_env", env_name="maze"),
        "no_entry_point": write_env_package(
            root, name="palaestra-env-bare", module="bare", entry_point=False
        ),
        "no_prefix": write_env_package(root, name="echo-env", module="plain_echo"),
    }
    return {key: build_dists(folder, root / key) for key, folder in made.items()}


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[tuple[str, HubData, dict[str, str]]]:
    data = HubData(tmp_path / "data")
    tokens = {}
    for user in ("alice", "bob"):
        data.catalog.add_user(user)
        tokens[user] = data.catalog.new_token(user)
    async with running_hub(data.root, max_upload_bytes=2_000_000) as url:
        yield url, data, tokens


async def get(url: str, accept: str = "") -> tuple[int, bytes, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Accept": accept} if accept else {}, allow_redirects=False) as r,
    ):
        return r.status, await r.read(), r.headers


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def state(data: HubData) -> tuple[list[str], list[tuple[Any, ...]]]:
    """What is on disk and in the catalog: both must be unchanged by a refused upload."""
    files = sorted(
        str(p.relative_to(data.root))
        for p in data.root.rglob("*")
        if p.is_file() and "hub.sqlite3" not in p.name
    )
    db = sqlite3.connect(data.root / "hub.sqlite3")
    rows = [tuple(r) for t in ("projects", "releases", "files") for r in db.execute(f"SELECT * FROM {t}")]
    db.close()
    return files, rows


# the index pip and uv read


def test_content_negotiation_follows_pep_691() -> None:
    pip = f"{JSON}, {index.HTML_TYPE};q=0.1, text/html;q=0.01"
    assert index.negotiate(pip) == "json"
    assert index.negotiate("text/html") == "html"
    assert index.negotiate("") == "html"
    assert index.negotiate(f"text/html;q=0.5, {JSON};q=0.4") == "html"
    assert index.negotiate("image/png") is None
    assert index.negotiate("image/png", JSON) == "json"


async def test_the_index_lists_files_with_hashes_metadata_and_versions(hub, dists) -> None:
    url, _data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"] + dists["v2"])
    status, body, headers = await get(f"{url}simple/palaestra-env-echo/", JSON)
    assert status == 200 and headers["Content-Type"] == JSON
    page = orjson.loads(body)
    assert page["versions"] == ["0.1.0", "0.2.0"] and page["meta"]["api-version"] == "1.1"
    by_name = {f["filename"]: f for f in page["files"]}
    for path in dists["v1"] + dists["v2"]:
        entry = by_name[path.name]
        assert entry["hashes"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        status, served, _ = await get(
            f"{url}simple/palaestra-env-echo/{entry['url']}".replace("/simple/palaestra-env-echo/../../", "/")
        )
        assert status == 200 and served == path.read_bytes()
    wheel = dists["v2"][0]
    entry = by_name[wheel.name]
    status, metadata, _ = await get(f"{url}files/palaestra-env-echo/{wheel.name}.metadata")
    assert hashlib.sha256(metadata).hexdigest() == entry["core-metadata"]["sha256"]
    with zipfile.ZipFile(wheel) as z:
        assert metadata == z.read("palaestra_env_echo-0.2.0.dist-info/METADATA")
    assert by_name[dists["v2"][1].name]["core-metadata"] is False  # an sdist's metadata is not offered

    status, body, headers = await get(f"{url}simple/palaestra-env-echo/", "text/html")
    assert (
        status == 200
        and b'data-core-metadata="sha256=' in body
        and f"#sha256={entry['hashes']['sha256']}".encode() in body
    )
    status, body, _ = await get(f"{url}simple/", JSON)
    assert orjson.loads(body)["projects"] == [{"name": "palaestra-env-echo"}]
    status, _, headers = await get(f"{url}simple/Palaestra_Env.Echo/")
    assert status == 301 and headers["Location"].endswith("palaestra-env-echo/")
    assert (await get(f"{url}simple/palaestra-env-nothing/", JSON))[0] == 404
    assert (await get(f"{url}simple/", "image/png"))[0] == 406


async def test_a_yanked_release_is_marked_and_skipped_unless_pinned(hub, dists) -> None:
    url, _data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"] + dists["v2"])
    with pytest.raises(HubError, match="403"):
        await set_yanked(url, tokens["bob"], "echo", "0.2.0", reason="broken")
    await set_yanked(url, tokens["alice"], "echo", "0.2.0", reason="broken")
    page = orjson.loads((await get(f"{url}simple/palaestra-env-echo/", JSON))[1])
    assert {f["filename"]: f["yanked"] for f in page["files"]} == {
        dists["v1"][0].name: False,
        dists["v1"][1].name: False,
        dists["v2"][0].name: "broken",
        dists["v2"][1].name: "broken",
    }
    assert b'data-yanked="broken"' in (await get(f"{url}simple/palaestra-env-echo/", "text/html"))[1]
    assert (await plan_install(url, "echo")).hub == ("palaestra-env-echo==0.1.0",)
    assert (await plan_install(url, "echo==0.2.0")).hub == ("palaestra-env-echo==0.2.0",)
    await set_yanked(url, tokens["alice"], "echo", "0.2.0", undo=True)
    plan = await plan_install(url, "palaestra-env-echo")
    assert plan.hub == ("palaestra-env-echo==0.2.0",) and plan.others == ("palaestra",)
    with pytest.raises(HubError, match="no version of palaestra-env-echo on the hub matches >=1"):
        await plan_install(url, "echo>=1")
    with pytest.raises(HubError, match="not on the hub"):
        await plan_install(url, "nothing")


# uploads: who may, and what is refused with nothing half-written


async def test_refused_uploads_change_nothing(hub, dists, tmp_path: Path) -> None:
    url, data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"])
    before = state(data)
    wheel = dists["v2"][0]
    corrupt = tmp_path / wheel.name
    raw = bytearray(wheel.read_bytes())
    raw[len(raw) // 3 : len(raw) // 3 + 64] = bytes(64)
    corrupt.write_bytes(bytes(raw))
    big = tmp_path / "big" / wheel.name
    big.parent.mkdir()
    big.write_bytes(wheel.read_bytes() + bytes(2_100_000))
    cases = [
        ("pah_wrong", dists["v2"][:1], "403 invalid or revoked API token"),
        ("", dists["v2"][:1], "401 this needs an API token"),
        (tokens["bob"], dists["v2"][:1], "403 palaestra-env-echo belongs to alice; this token is bob's"),
        (tokens["alice"], dists["v1"][:1], "409 palaestra_env_echo-0.1.0-py3-none-any.whl exists"),
        (tokens["alice"], [corrupt], "400 not a valid wheel"),
        (tokens["alice"], [big], "413"),
        (tokens["alice"], dists["no_entry_point"][:1], "400 .*palaestra.environments"),
        (tokens["alice"], dists["no_prefix"][:1], "400 .*palaestra-env-"),
    ]
    for token, paths, message in cases:
        with pytest.raises(HubError, match=message):
            await upload(url, token, paths)
        assert state(data) == before, message
    assert not any(data.tmp.iterdir())
    # the same version cannot come back as another file of the same kind either
    renamed = tmp_path / "renamed" / dists["v1"][0].name.replace("py3-none-any", "py311-none-any")
    renamed.parent.mkdir()
    shutil.copy(dists["v1"][0], renamed)
    with pytest.raises(HubError, match=r"409 palaestra-env-echo 0\.1\.0 already has a wheel"):
        await upload(url, tokens["alice"], [renamed])
    # bob may publish a project of his own
    await upload(url, tokens["bob"], dists["other"])
    assert {p["name"]: p["owner"] for p in await projects(url)} == {
        "palaestra-env-echo": "alice",
        "palaestra-env-maze": "bob",
    }


async def test_a_claimed_digest_that_does_not_match_is_refused(hub, dists) -> None:
    url, data, tokens = hub
    form = aiohttp.FormData()
    form.add_field("sha256_digest", "0" * 64)
    form.add_field("content", dists["v1"][0].read_bytes(), filename=dists["v1"][0].name)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}legacy/", data=form, headers={"Authorization": basic("__token__", tokens["alice"])}
        ) as r,
    ):
        assert r.status == 400 and "does not match the file received" in await r.text()
    assert data.catalog.filenames() == set()


# pages


async def test_pages_render_the_readme_inert_and_update_after_an_upload(hub, dists) -> None:
    url, _data, tokens = hub
    status, home, headers = await get(url)
    assert status == 200 and b"Nothing is published yet" in home
    csp = headers["Content-Security-Policy"]
    assert f"script-src '{pages.SCRIPT_INTEGRITY}';" in csp and "'self'; img-src" not in csp  # hub.js only
    assert "unsafe-inline" not in csp and headers["X-Content-Type-Options"] == "nosniff"
    await upload(url, tokens["alice"], dists["v1"])
    home = (await get(url))[1].decode()
    assert "palaestra-env-echo" in home and "1 environment" in home  # the cached page was refreshed
    page = (await get(f"{url}env/palaestra-env-echo/"))[1].decode()
    readme = page[page.index('<article class="readme">') : page.index("</article>")]
    assert "<script" not in readme and "<img" not in readme and "href=" not in readme  # tags are text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in readme and "[click](javascript:alert(3))" in readme
    assert "<h1>Echo</h1>" in readme and "<td>2</td>" in readme  # the Markdown itself renders
    assert f"palaestra install palaestra-env-echo --hub {url}" in page
    assert f"uv pip install --extra-index-url {url}simple/ palaestra-env-echo" in page
    assert "<code>num_examples</code>" in page  # eval defaults, read from the sdist's pyproject.toml
    assert (await get(f"{url}?q=nothing-matches"))[1].count(b'class="card"') == 1
    assert b'hidden><h2><a href="env/palaestra-env-echo/"' in (await get(f"{url}?q=nothing-matches"))[1]
    status, _, headers = await get(f"{url}env/Palaestra_Env_Echo")
    assert status == 301
    assert (await get(f"{url}env/palaestra-env-nothing/"))[0] == 404
    assert (await get(f"{url}static/hub.css"))[0] == 200 and (await get(f"{url}static/../hub.sqlite3"))[
        0
    ] == 404


# results


def saved_run(path: Path, *, status: str = "complete", env_id: str = "echo", reward: float = 0.75) -> Path:
    from palaestra.eval.store import METADATA, RESULTS

    path.mkdir(parents=True)
    (path / RESULTS).write_text("")
    meta = {
        "run_id": f"run-{path.name}",
        "env_id": env_id,
        "env_args": {},
        "model": "gpt-x",
        "sampling": {"temperature": 0.7, "max_tokens": 64},
        "num_examples": 8,
        "rollouts_per_example": 2,
        "seed": 3,
        "versions": {"palaestra": "0.1.0", "env_package": "palaestra-env-echo 0.1.0"},
        "status": status,
        "counts": {"expected": 16, "saved": 16, "errors": 1},
        "summary": {
            "n_examples": 8,
            "reward": {"mean": reward, "std": 0.1, "ci95": [reward - 0.1, reward + 0.1], "n": 16},
            "metrics": {"exact": {"mean": reward, "std": 0.1, "n": 16}},
        },
    }
    (path / METADATA).write_bytes(orjson.dumps(meta))
    return path


async def test_results_make_a_leaderboard_with_a_sandboxed_report(hub, dists, tmp_path: Path) -> None:
    url, _data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"])
    with pytest.raises(HubError, match="interrupted, not complete"):
        await attach_results(url, tokens["bob"], saved_run(tmp_path / "a", status="interrupted"))
    with pytest.raises(HubError, match="404 no environment named 'maze'"):
        await attach_results(url, tokens["bob"], saved_run(tmp_path / "b", env_id="maze"), with_report=False)
    done = await attach_results(url, tokens["bob"], saved_run(tmp_path / "c", reward=0.5))
    await attach_results(url, tokens["alice"], saved_run(tmp_path / "d", reward=0.9), with_report=False)
    with pytest.raises(HubError, match="409 run run-c is already attached"):
        await attach_results(url, tokens["bob"], tmp_path / "c")
    assert done["url"] == f"{url}env/palaestra-env-echo/#results"
    page = (await get(f"{url}env/palaestra-env-echo/"))[1].decode()
    board = page[page.index('<section id="results">') : page.index("</section>")]
    assert board.index("0.900") < board.index("0.500")  # best first
    assert "[0.400, 0.600]" in board and "8×2" in board and "temperature=0.7, max_tokens=64" in board
    assert "palaestra eval echo -m gpt-x -n 8 -r 2 --seed 3 -S" in board
    assert board.count("report.html") == 1
    status, report, headers = await get(f"{url}results/{done['id']}/report.html")
    assert status == 200 and b"gpt-x" in report
    assert str(tmp_path).encode() not in report  # the uploader's folders stay private
    assert headers["Content-Security-Policy"].startswith("sandbox allow-scripts")


# the catalog


def test_the_catalog_migrates_keeps_only_token_hashes_and_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "hub.sqlite3"
    catalog = Catalog(path)
    assert catalog.schema_version == len(MIGRATIONS)
    catalog.add_user("alice")
    token = catalog.new_token("alice")
    assert token.encode() not in path.read_bytes() + (tmp_path / "hub.sqlite3-wal").read_bytes()
    assert catalog.authenticate(token).name == "alice"
    assert Catalog(path).authenticate(token).name == "alice"  # reopened: nothing migrates twice
    assert catalog.revoke_tokens("alice") == 1
    with pytest.raises(CatalogError, match="invalid or revoked"):
        catalog.authenticate(token)
    with pytest.raises(CatalogError, match="letters, digits"):
        catalog.add_user("a b")
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(CatalogError, match="upgrade palaestra"):
        Catalog(path)


async def test_an_oversized_form_field_is_refused_even_without_a_length(hub) -> None:
    url, data, tokens = hub

    async def body() -> Any:  # a chunked body: no Content-Length to refuse it up front
        yield b'--b\r\nContent-Disposition: form-data; name="run"\r\n\r\n'
        for _ in range(40):
            yield b"x" * 65536
        yield b"\r\n--b--\r\n"

    headers = {
        "Authorization": f"Bearer {tokens['alice']}",
        "Content-Type": "multipart/form-data; boundary=b",
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}api/results", data=body(), headers=headers) as r,
    ):
        assert r.status == 413 and "form field 'run' is over this hub's limit" in await r.text()
    assert not any(data.tmp.iterdir())


# what the hub serves: no page runs what an uploader sent, no response shows where a run was served


def directives(csp: str) -> dict[str, str]:
    return {d.strip().split(" ", 1)[0]: d.strip().partition(" ")[2] for d in csp.split(";") if d.strip()}


async def test_every_response_is_nosniff_and_uploaded_files_are_sandboxed_attachments(hub, dists) -> None:
    url, _data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"])
    wheel = dists["v1"][0].name
    for path in (wheel, wheel + ".metadata", dists["v1"][1].name):
        status, _, headers = await get(f"{url}files/palaestra-env-echo/{path}")
        assert status == 200 and headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Content-Disposition"].startswith(f'attachment; filename="{path}"'), path
        assert directives(headers["Content-Security-Policy"]) == {
            "default-src": "'none'",
            "sandbox": "",
            "frame-ancestors": "'none'",
        }
    for path, accept in (
        ("", ""),
        ("env/palaestra-env-echo/", ""),
        ("simple/", JSON),
        ("simple/", "text/html"),
        ("api/projects.json", ""),
        ("static/hub.js", ""),
        ("nothing", ""),
        ("env/x/", ""),
    ):
        status, _, headers = await get(url + path, accept)
        assert headers["X-Content-Type-Options"] == "nosniff" and "Content-Security-Policy" in headers, path
    page_csp = directives((await get(url))[2]["Content-Security-Policy"])
    assert page_csp["script-src"] == f"'{pages.SCRIPT_INTEGRITY}'" and page_csp["default-src"] == "'none'"
    body = (await get(url))[1].decode()
    assert (
        f'<meta http-equiv="Content-Security-Policy" content="{pages.META_CSP}">' in body
    )  # a static copy keeps it
    assert f'src="static/hub.js" integrity="{pages.SCRIPT_INTEGRITY}"' in body


async def test_a_wheel_with_a_script_before_its_zip_is_refused(hub, dists, tmp_path: Path) -> None:
    url, data, tokens = hub
    polyglot = tmp_path / dists["v1"][0].name
    polyglot.write_bytes(b"window.pwned = 1; /*" + dists["v1"][0].read_bytes())
    with pytest.raises(HubError, match="400 not a valid wheel: it has data before its first member"):
        await upload(url, tokens["alice"], [polyglot])
    assert data.catalog.filenames() == set() and not any(data.tmp.iterdir())


HOSTILE = '<img src=x onerror="window.pwned=1">'


async def test_results_show_only_what_a_leaderboard_needs_escaped(hub, dists, tmp_path: Path) -> None:
    url, data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"])
    run = saved_run(tmp_path / "a")
    meta = orjson.loads((run / "metadata.json").read_bytes())
    meta.update(
        model=HOSTILE,
        base_url="http://user:hunter2@10.0.0.7:8000/v1",
        api_key_var="SECRET_KEY_VAR",
        run_id=HOSTILE,
        finished_at=HOSTILE,
        env_args={"opponent": HOSTILE},
        versions={"palaestra": HOSTILE, "env_package": f"palaestra-env-echo {HOSTILE}"},
    )
    meta["summary"]["metrics"] = {HOSTILE: {"mean": 0.5}}
    (run / "metadata.json").write_bytes(orjson.dumps(meta))
    await attach_results(url, tokens["bob"], run, with_report=False)
    # a record an older hub kept whole, base_url included
    db = sqlite3.connect(data.root / "hub.sqlite3")
    (stored,) = db.execute("SELECT run FROM results").fetchone()
    db.execute(
        "UPDATE results SET run = ?", (orjson.dumps({**orjson.loads(stored), "base_url": meta["base_url"]}),)
    )
    db.commit()
    db.close()
    await upload(url, tokens["alice"], dists["v2"][:1])  # a write: the pages are rendered anew

    out = tmp_path / "export"
    export(data, out, hub_url="https://envs.example/")
    served = [(await get(url + p))[1].decode() for p in ("", "env/palaestra-env-echo/", "api/projects.json")]
    exported = [p.read_text() for p in out.rglob("*") if p.suffix in (".html", ".json")]
    for text in served + exported:
        assert HOSTILE not in text and "<img" not in text  # escaped everywhere it shows
        assert "hunter2" not in text and "10.0.0.7" not in text and "SECRET_KEY_VAR" not in text
        assert "'reward':" not in text and "{'run_id'" not in text  # no Python repr of a record
    home = served[0]
    assert "1 eval result · best 0.750 (&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;)" in home
    board = served[1][served[1].index('<section id="results">') :]
    assert " -b " not in board and html.escape(f"palaestra eval echo -m '{HOSTILE}'") in board
    assert data.catalog.results("palaestra-env-echo")[0].keys() == {
        *RECORD_KEYS,
        "id",
        "has_report",
        "uploaded_at",
        "uploader",
    }


async def test_a_page_is_rendered_once_whatever_host_it_is_asked_for(hub, dists, monkeypatch) -> None:
    url, _data, tokens = hub
    await upload(url, tokens["alice"], dists["v1"])
    rendered = []
    original = pages.project
    monkeypatch.setattr(pages, "project", lambda *a, **k: rendered.append(1) or original(*a, **k))
    for host in ("a.example", "b.example:8080", '"><script>x</script>'):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{url}env/palaestra-env-echo/", headers={"Host": host}) as r,
        ):
            page = await r.text()
        assert f"--hub {html.escape(f'http://{host}/')}" in page and "<script>x" not in page
    assert rendered == [1]  # a README is rendered once, not once per Host header

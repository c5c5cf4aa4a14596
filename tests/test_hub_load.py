"""The hub under load, in a child process: 50 concurrent installs' worth of index requests while 10
uploads land, and 10 concurrent uploads of one file. Correctness only (every request answered,
every hash right, no upload lost or doubled); the throughput is measured by benchmarks/hub.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp
import orjson
import pytest

from palaestra.hub.catalog import Catalog
from palaestra.hub.client import HubError, upload
from palaestra.hub.data import HubData
from palaestra.hub.index import JSON_TYPE
from palaestra.testing.hub import build_dists, hub_process, running_hub, write_env_package

# what pip sends for an index page: PEP 691 JSON preferred, HTML accepted
PIP_ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"
ECHO = "palaestra-env-echo"
PUBLISHED = (ECHO, "palaestra-env-alpha", "palaestra-env-beta")
NEW_VERSIONS = tuple(f"0.{i}.0" for i in range(2, 12))  # the 10 uploaded under load
INSTALLS = 50
TIMEOUT = aiohttp.ClientTimeout(total=60, connect=10)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Built once: wheel + sdist of the three published packages, and a wheel of each new echo version."""
    root = tmp_path_factory.mktemp("load-dists")
    out: dict[str, list[Path]] = {}
    for name in PUBLISHED:
        short = name.removeprefix("palaestra-env-")
        package = write_env_package(root / "src", name=name, module=f"{short}_env", env_name=short)
        out[name] = build_dists(package, root / "dist" / short)
    for version in NEW_VERSIONS:
        package = write_env_package(root / "src", version=version)
        out[version] = [p for p in build_dists(package, root / "dist" / version) if p.suffix == ".whl"]
        assert len(out[version]) == 1
    return out


@contextmanager
def hub(data: Path) -> Iterator[tuple[str, str, subprocess.Popen[str], list[str]]]:
    """A hub in a child process over ``data`` with user alice; yields (url, token, process, log).

    ``log`` is filled with the hub's output once ``stop`` has ended it.
    """
    hub_data = HubData(data)
    hub_data.catalog.add_user("alice")
    token = hub_data.catalog.new_token("alice")
    log: list[str] = []
    with hub_process(data) as (url, proc):
        yield url, token, proc, log


def stop(proc: subprocess.Popen[str], log: list[str]) -> None:
    """End the hub and keep what it wrote (a traceback there is an error under load)."""
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    log.append(out or "")


async def install(session: aiohttp.ClientSession, url: str, name: str) -> dict[str, Any]:
    """What pip does for one package: the JSON index page, the wheel's core metadata, the wheel."""
    page_url = urljoin(url, f"simple/{name}/")
    async with session.get(page_url, headers={"Accept": PIP_ACCEPT}) as r:
        assert r.status == 200, (page_url, r.status, await r.text())
        assert r.headers["Content-Type"].startswith(JSON_TYPE)
        page = orjson.loads(await r.read())
    wheels = [f for f in page["files"] if f["filename"].endswith(".whl")]
    assert wheels, page
    entry = wheels[-1]  # the newest: for echo, possibly a wheel uploaded a moment ago
    wheel_url = urljoin(page_url, entry["url"])
    async with session.get(wheel_url + ".metadata") as r:
        assert r.status == 200, (wheel_url, r.status)
        metadata = await r.read()
    async with session.get(wheel_url) as r:
        assert r.status == 200, (wheel_url, r.status)
        wheel = await r.read()
    assert hashlib.sha256(metadata).hexdigest() == entry["core-metadata"]["sha256"], entry["filename"]
    assert hashlib.sha256(wheel).hexdigest() == entry["hashes"]["sha256"], entry["filename"]
    assert len(wheel) == entry["size"]
    assert f"Name: {name}".encode() in metadata
    return {"filename": entry["filename"], "requests": 3}


async def project_page(url: str, name: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.get(urljoin(url, f"simple/{name}/"), headers={"Accept": JSON_TYPE}) as r,
    ):
        assert r.status == 200
        page: dict[str, Any] = orjson.loads(await r.read())
        return page


def files_on_disk(data: Path) -> set[str]:
    return {str(p.relative_to(data / "files")) for p in (data / "files").rglob("*") if p.is_file()}


async def test_concurrent_installs_and_uploads_lose_nothing(
    tmp_path: Path, dists: dict[str, list[Path]]
) -> None:
    data = tmp_path / "data"
    with hub(data) as (url, token, proc, log):
        for name in PUBLISHED:
            await asyncio.wait_for(upload(url, token, dists[name]), 30)

        connector = aiohttp.TCPConnector(limit=100)
        async with aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as session:
            installs = [install(session, url, PUBLISHED[i % len(PUBLISHED)]) for i in range(INSTALLS)]
            uploads = [upload(url, token, dists[v]) for v in NEW_VERSIONS]
            done = await asyncio.wait_for(asyncio.gather(*installs, *uploads, return_exceptions=True), 120)
        errors = [d for d in done if isinstance(d, BaseException)]
        assert not errors, errors[:3]
        installed, uploaded = done[:INSTALLS], done[INSTALLS:]
        assert sum(d["requests"] for d in installed) == 3 * INSTALLS
        assert [u[0]["version"] for u in uploaded] == list(NEW_VERSIONS)

        # every upload is listed afterwards, with the hash of the file that was sent
        page = await project_page(url, ECHO)
        listed = {f["filename"]: f["hashes"]["sha256"] for f in page["files"]}
        for version in NEW_VERSIONS:
            (wheel,) = dists[version]
            assert listed.get(wheel.name) == sha256(wheel), (version, sorted(listed))
        assert sorted(page["versions"]) == sorted(["0.1.0", *NEW_VERSIONS])
        for name in PUBLISHED[1:]:
            assert {f["filename"] for f in (await project_page(url, name))["files"]} == {
                p.name for p in dists[name]
            }
        stop(proc, log)
    assert proc.returncode == 0, log
    assert "Traceback" not in log[0] and "error serving" not in log[0], log[0]

    # the catalog and the files agree, row for row, with what was uploaded
    sent = {p.name: p for name in PUBLISHED for p in dists[name]} | {
        p.name: p for v in NEW_VERSIONS for p in dists[v]
    }
    catalog = Catalog(data / "hub.sqlite3")
    assert catalog.filenames() == set(sent)
    assert [p["name"] for p in catalog.projects()] == sorted(PUBLISHED)
    for name in PUBLISHED:
        project = catalog.project(name)
        assert project is not None and project["owner"] == "alice"
        versions = [r["version"] for r in project["releases"]]
        assert sorted(versions) == sorted(["0.1.0", *NEW_VERSIONS] if name == ECHO else ["0.1.0"])
        for release in project["releases"]:
            kinds = sorted(f["kind"] for f in release["files"])
            assert kinds == (["sdist", "wheel"] if release["version"] == "0.1.0" else ["wheel"])
            for f in release["files"]:
                assert (
                    f["sha256"] == sha256(sent[f["filename"]])
                    and f["size"] == sent[f["filename"]].stat().st_size
                )
                assert f["uploader"] == "alice"
    owner = {p.name: name for name in PUBLISHED for p in dists[name]} | {
        p.name: ECHO for v in NEW_VERSIONS for p in dists[v]
    }
    assert files_on_disk(data) == {f"{owner[n]}/{n}" for n in sent} | {
        f"{owner[n]}/{n}.metadata" for n in sent
    }
    for filename, path in sent.items():
        assert sha256(data / "files" / owner[filename] / filename) == sha256(path)
    assert not any((data / "tmp").iterdir())


async def test_concurrent_uploads_of_one_file_keep_exactly_one(
    tmp_path: Path, dists: dict[str, list[Path]]
) -> None:
    data = tmp_path / "data"
    (wheel,) = dists[NEW_VERSIONS[0]]
    with hub(data) as (url, token, proc, log):
        done = await asyncio.wait_for(
            asyncio.gather(*(upload(url, token, [wheel]) for _ in range(10)), return_exceptions=True), 60
        )
        ok = [d for d in done if not isinstance(d, BaseException)]
        refused = [d for d in done if isinstance(d, BaseException)]
        assert ok == [[{"filename": wheel.name, "name": ECHO, "version": NEW_VERSIONS[0]}]]
        assert len(refused) == 9
        for exc in refused:
            assert isinstance(exc, HubError) and " 409 " in str(exc) and "exists" in str(exc), exc
        page = await project_page(url, ECHO)
        assert [(f["filename"], f["hashes"]["sha256"]) for f in page["files"]] == [
            (wheel.name, sha256(wheel))
        ]
        stop(proc, log)
    assert proc.returncode == 0, log
    assert "Traceback" not in log[0], log[0]
    assert Catalog(data / "hub.sqlite3").filenames() == {wheel.name}
    assert files_on_disk(data) == {f"{ECHO}/{wheel.name}", f"{ECHO}/{wheel.name}.metadata"}
    assert sha256(data / "files" / ECHO / wheel.name) == sha256(wheel)
    assert not any((data / "tmp").iterdir())


async def test_a_page_rendered_across_an_upload_is_not_cached_stale(
    tmp_path: Path, dists: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a read of /simple/NAME/ can straddle an upload: the read must not outlive the write.

    Made deterministic by holding one render's thread (after its catalog read) until the upload is done.
    """
    data = tmp_path / "data"
    hub_data = HubData(data)
    hub_data.catalog.add_user("alice")
    token = hub_data.catalog.new_token("alice")
    read, release = threading.Event(), threading.Event()
    original = Catalog.project

    def held_project(self: Catalog, name: str) -> dict[str, Any] | None:
        found = original(self, name)
        if not release.is_set():
            read.set()
            assert release.wait(30)
        return found

    (new_wheel,) = dists[NEW_VERSIONS[0]]
    async with running_hub(data) as url:
        release.set()
        await upload(url, token, dists[ECHO])
        release.clear()
        monkeypatch.setattr(Catalog, "project", held_project)
        reader = asyncio.create_task(project_page(url, ECHO))  # renders from the catalog as it is now
        assert await asyncio.wait_for(asyncio.to_thread(read.wait, 30), 35)
        await asyncio.wait_for(upload(url, token, [new_wheel]), 30)  # lands while that render is held
        release.set()
        before = await asyncio.wait_for(reader, 30)
        assert new_wheel.name not in {f["filename"] for f in before["files"]}  # it began before the upload
        after = await project_page(url, ECHO)
        assert new_wheel.name in {f["filename"] for f in after["files"]}

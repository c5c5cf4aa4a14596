"""The hub end to end through the ``palaestra`` CLI: publish, install with plain pip, evaluate,
attach results, yank, export as static files, and survive a server killed mid-upload.

Every hub here runs in a child process (``hub_process``) and every step is a real command: the
``palaestra`` console script, ``python -m build`` (``--no-isolation``: nothing is downloaded) and
the plain pip of a fresh venv that has no palaestra in it. pip runs with ``PIP_CONFIG_FILE=/dev/null``
and no ``PIP_*`` variables from this machine, so its configured find-links and extra indexes do not
take part: what it installs came from the hub under test and from nowhere else.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from package_index import static_server

from palaestra.hub.catalog import Catalog
from palaestra.hub.client import upload
from palaestra.hub.data import HubData
from palaestra.hub.index import JSON_TYPE
from palaestra.testing.hub import build_dists, hub_process, write_env_package

REPO = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p.name for p in (REPO / "environments").iterdir() if (p / "pyproject.toml").is_file())
_SCRIPT = Path(sys.executable).with_name("palaestra")
CLI = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "palaestra.cli"]
ECHO = "palaestra-env-echo"
HELPER = "palaestra-env-helper"
MODEL = "scripted:echo_env:solve"
# echo depends on palaestra and rich (from pip's own index) and on another hub package
ECHO_DEPS = ("palaestra", "rich>=13", f"{HELPER}>=0.1")


# helpers


def base_env(**extra: str) -> dict[str, str]:
    """This environment without any hub or pip settings, and pip kept to the index it is given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "PALAESTRA_HUB_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # not this machine's pip.conf (find-links, extra indexes, constraints)
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        PIP_NO_INPUT="1",
        PIP_DEFAULT_TIMEOUT="20",
    )
    env.update(extra)
    return env


def run(
    command: list[str], *, env: dict[str, str] | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command, env=env or base_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"{shlex.join(command)} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
    return done


def palaestra(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return run([*CLI, *args], env=env, check=check)


def get(url: str, *, accept: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def simple_files(url: str, project: str) -> list[dict[str, Any]]:
    status, body, _ = get(urljoin(url, f"simple/{project}/"), accept=JSON_TYPE)
    assert status == 200, body
    return list(json.loads(body)["files"])


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused command (exit 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("palaestra: error: "), lines[0]
    return lines[0]


def installed(python: Path, name: str = ECHO) -> dict[str, Any] | None:
    """What ``python``'s environment has installed of ``name``: version and entry points."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "try:\n    d = m.distribution(sys.argv[1])\n"
        "except m.PackageNotFoundError:\n    print('null'); raise SystemExit\n"
        "print(json.dumps({'version': d.version, 'entry_points': sorted([e.group, e.name, e.value] "
        "for e in d.entry_points)}))"
    )
    done = run([str(python), "-c", code, name])
    found: dict[str, Any] | None = json.loads(done.stdout)
    return found


def version(venv: Path, name: str = ECHO) -> str | None:
    found = installed(venv / "bin" / "python", name)
    return None if found is None else str(found["version"])


def pip(fresh: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([str(fresh / "bin" / "pip"), *args], check=check)


def leaderboard_rows(page: str) -> list[list[str]]:
    """The leaderboard's rows as lists of cell texts (tags stripped)."""
    section = page.split('<section id="results">', 1)[1].split("</section>", 1)[0]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>", 1)[1], flags=re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
        rows.append([html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells])
    return rows


def report_links(page: str) -> list[str]:
    return re.findall(r'href="([^"]*results/\d+/report\.html)"', page)


def tree(folder: Path) -> set[str]:
    """Every path under ``folder`` but caches (which tests running at the same time may write)."""
    skip = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
    return {
        str(p.relative_to(folder)) for p in folder.rglob("*") if not skip & set(p.relative_to(folder).parts)
    }


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


# fixtures (module scope: one hub, one fresh venv, one set of packages for the whole module)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A hub in a child process, and alice's token made with ``palaestra hub token``."""
    data = tmp_path_factory.mktemp("hub-data")
    token = palaestra("hub", "token", "alice", "--data", str(data)).stdout.strip()
    assert token.startswith("pah_") and "\n" not in token
    with hub_process(data) as (url, proc):
        env = base_env(PALAESTRA_HUB_URL=url, PALAESTRA_HUB_TOKEN=token)
        yield {"url": url, "token": token, "data": data, "env": env, "proc": proc}
        assert proc.poll() is None, "the hub died during the tests"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with only pip (and setuptools) in it: no palaestra."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=180)
    return venv


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.fixture(scope="module")
def published(hub: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """helper 0.1.0 and echo 0.1.0 and 0.2.0, each published with ``palaestra hub publish``."""
    src = tmp_path_factory.mktemp("packages")
    folders = [
        write_env_package(src, name=HELPER, module="helper_env", env_name="helper"),
        write_env_package(src, version="0.1.0", dependencies=ECHO_DEPS),
        write_env_package(
            src, version="0.2.0", dependencies=ECHO_DEPS, readme="# echo\n\nRepeat a word, version two.\n"
        ),
    ]
    outputs = []
    for folder in folders:
        before = tree(folder)
        outputs.append(palaestra("hub", "publish", str(folder), "--no-isolation", env=hub["env"]).stdout)
        assert tree(folder) == before, "publishing wrote into the package's folder"
    return {"folders": folders, "outputs": outputs}


@pytest.fixture(scope="module")
def installed_with_pip(hub: dict[str, Any], published: dict[str, Any], fresh: Path) -> dict[str, Any]:
    """Plain pip in the fresh venv: the newest echo, then ``==0.1.0`` (left installed)."""
    index = urljoin(hub["url"], "simple/")
    pip(fresh, "install", "--no-deps", "--index-url", index, ECHO)
    newest = installed(fresh / "bin" / "python")
    pip(fresh, "install", "--no-deps", "--index-url", index, f"{ECHO}==0.1.0")
    pinned = installed(fresh / "bin" / "python")
    return {"newest": newest, "pinned": pinned}


@pytest.fixture(scope="module")
def attached(
    hub: dict[str, Any],
    installed_with_pip: dict[str, Any],
    fresh: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """An eval of echo, loaded from the fresh venv's packages, attached with ``palaestra hub results``."""
    out = tmp_path_factory.mktemp("runs")
    env = {**hub["env"], "PYTHONPATH": str(site_packages(fresh))}
    palaestra("eval", "echo", "-m", MODEL, "-n", "8", "-r", "1", "-o", str(out), "--quiet", env=env)
    runs = sorted(out.glob("evals/*/*/metadata.json"))
    assert len(runs) == 1, runs
    run_dir = runs[0].parent
    results = palaestra("hub", "results", str(run_dir), env=hub["env"]).stdout
    return {"run_dir": run_dir, "metadata": json.loads(runs[0].read_text()), "results_stdout": results}


@pytest.fixture(scope="module")
def yanked(hub: dict[str, Any], published: dict[str, Any]) -> str:
    """echo 0.2.0 yanked with ``palaestra hub yank``; its output."""
    return palaestra("hub", "yank", ECHO, "0.2.0", "--reason", "broken", env=hub["env"]).stdout


# 1. publish, install with plain pip, evaluate, attach, see; yank


def test_published_files_are_listed(hub: dict[str, Any], published: dict[str, Any]) -> None:
    echo_out = published["outputs"][1] + published["outputs"][2]
    for version in ("0.1.0", "0.2.0"):
        assert f"published palaestra_env_echo-{version}-py3-none-any.whl" in echo_out
        assert f"published palaestra_env_echo-{version}.tar.gz" in echo_out
    assert f"page: {hub['url']}env/{ECHO}/" in published["outputs"][2]
    names = sorted(f["filename"] for f in simple_files(hub["url"], ECHO))
    assert names == [
        "palaestra_env_echo-0.1.0-py3-none-any.whl",
        "palaestra_env_echo-0.1.0.tar.gz",
        "palaestra_env_echo-0.2.0-py3-none-any.whl",
        "palaestra_env_echo-0.2.0.tar.gz",
    ]


@pytest.mark.slow  # a fresh venv and pip installs: over 10 s on its own
def test_plain_pip_installs_from_the_hub(fresh: Path, installed_with_pip: dict[str, Any]) -> None:
    no_palaestra = run([str(fresh / "bin" / "python"), "-c", "import palaestra"], check=False)
    assert no_palaestra.returncode != 0 and "ModuleNotFoundError" in no_palaestra.stderr
    entry_point = ["palaestra.environments", "echo", "echo_env:load_environment"]
    assert installed_with_pip["newest"] == {"version": "0.2.0", "entry_points": [entry_point]}
    assert installed_with_pip["pinned"] == {"version": "0.1.0", "entry_points": [entry_point]}
    shown = pip(fresh, "show", ECHO).stdout
    assert "Version: 0.1.0" in shown and f"Requires: palaestra, {HELPER}, rich" in shown


@pytest.mark.slow  # a fresh venv and pip installs: over 10 s on its own
def test_eval_attach_and_leaderboard(hub: dict[str, Any], attached: dict[str, Any]) -> None:
    meta = attached["metadata"]
    assert meta["status"] == "complete" and meta["env_id"] == "echo" and meta["model"] == MODEL
    assert meta["summary"]["reward"]["mean"] == 1.0
    page_url = f"{hub['url']}env/{ECHO}/"
    assert attached["results_stdout"].strip() == f"attached to {ECHO}: {page_url}#results"

    status, body, headers = get(page_url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    rows = leaderboard_rows(page)
    assert len(rows) == 1, rows
    row = rows[0]
    # #, model, reward, 95% CI, n×r, sampling, seed, env version, ...
    assert row[:3] == ["1", MODEL, "1.000"]
    assert row[4] == "8×1"
    assert row[7] == "0.1.0"  # the version installed in the fresh venv when the eval ran
    assert "alice" in row
    links = report_links(page)
    assert len(links) == 1
    status, report, headers = get(urljoin(page_url, links[0]))
    assert status == 200 and b"<html" in report.lower()
    assert "sandbox" in headers["Content-Security-Policy"]


@pytest.mark.slow  # a fresh venv and pip installs: over 10 s on its own
def test_yank_then_pip_skips_it_unless_pinned(
    hub: dict[str, Any], yanked: str, fresh: Path, tmp_path: Path
) -> None:
    index = urljoin(hub["url"], "simple/")
    assert yanked.strip() == f"yanked {ECHO} 0.2.0"
    marks = {f["filename"]: f["yanked"] for f in simple_files(hub["url"], ECHO)}
    assert marks["palaestra_env_echo-0.2.0-py3-none-any.whl"] == "broken"
    assert marks["palaestra_env_echo-0.1.0-py3-none-any.whl"] is False

    # plain pip: the yanked release is skipped by a range, and taken when pinned (PEP 592)
    pip(fresh, "download", "--no-deps", "-d", str(tmp_path / "any"), "--index-url", index, ECHO)
    assert [p.name for p in (tmp_path / "any").iterdir()] == ["palaestra_env_echo-0.1.0-py3-none-any.whl"]
    pin = pip(
        fresh, "download", "--no-deps", "-d", str(tmp_path / "pin"), "--index-url", index, f"{ECHO}==0.2.0"
    )
    assert [p.name for p in (tmp_path / "pin").iterdir()] == ["palaestra_env_echo-0.2.0-py3-none-any.whl"]
    assert "yanked" in pin.stdout + pin.stderr and "broken" in pin.stdout + pin.stderr

    # palaestra install: a pin installs the yanked release, a bare name the newest live one
    python = str(fresh / "bin" / "python")
    done = palaestra("install", "echo==0.2.0", "--python", python, "--no-deps", env=hub["env"])
    assert done.stdout.count("ran: ") == 1
    assert version(fresh) == "0.2.0"
    assert version(fresh, HELPER) == "0.1.0"
    done = palaestra("install", "echo", "--python", python, "--no-deps", env=hub["env"])
    command = shlex.split(done.stdout.strip().removeprefix("ran: "))
    assert command[:6] == [f"PIP_CONFIG_FILE={os.devnull}", python, "-m", "pip", "install", "--isolated"]
    assert version(fresh) == "0.1.0"

    # --dry-run: the hub's files pinned by URL and sha256, by a pip that reads no configuration;
    # then the other dependencies from pip's own index, with the hub's files named again
    done = palaestra("install", "echo", "--python", python, "--dry-run", env=hub["env"])
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("would run: ") for line in lines), lines
    first, second = (shlex.split(line.removeprefix("would run: ")) for line in lines)
    pins = sorted(
        f"{name} @ {hub['url']}files/{name}/{name.replace('-', '_')}-0.1.0-py3-none-any.whl#sha256="
        + next(
            f["hashes"]["sha256"]
            for f in simple_files(hub["url"], name)
            if f["filename"].endswith("0.1.0-py3-none-any.whl")
        )
        for name in (ECHO, HELPER)
    )
    assert first[:6] == [f"PIP_CONFIG_FILE={os.devnull}", python, "-m", "pip", "install", "--isolated"]
    assert "--no-index" in first and sorted(first[-2:]) == pins
    assert second[:6] == [python, "-m", "pip", "install", "palaestra", "rich>=13"]
    assert sorted(second[6:]) == pins and "--isolated" not in second


# 2. every bundled environment publishes as it is


def test_every_bundled_environment_publishes(hub: dict[str, Any]) -> None:
    assert BUNDLED == [
        "double_check",
        "long_context_qa",
        "order_desk",
        "python_tasks",
        "reverse_text",
        "sql_quiz",
        "tictactoe",
        "wiki_search",
    ]
    for name in BUNDLED:
        folder = REPO / "environments" / name
        before = tree(folder)
        done = palaestra("hub", "publish", str(folder), "--no-isolation", env=hub["env"])
        assert done.stdout.count("published ") == 2, done.stdout  # a wheel and an sdist
        assert tree(folder) == before, f"publishing {name} wrote into environments/{name}"

    listed = palaestra("envs", "--hub", env=hub["env"]).stdout
    envs = {line.split("\t")[0]: line.split("\t")[1] for line in listed.strip().splitlines()}
    for name in BUNDLED:
        project = f"palaestra-env-{name.replace('_', '-')}"
        assert envs[name] == f"{project} 0.1.0"
        assert get(f"{hub['url']}env/{project}/")[0] == 200

    found = palaestra("hub", "search", "tic", env=hub["env"]).stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in found] == ["palaestra-env-tictactoe"]
    assert found[0].split("\t")[2] == "tictactoe"


# 3. the server killed mid-upload


def _start_upload(url: str, token: str, wheel: Path) -> socket.socket:
    """POST the wheel to /legacy/ by hand, sending half of the file and then nothing more."""
    parts = urlsplit(url)
    boundary = "palaestra-" + uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name=":action"\r\n\r\nfile_upload\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{wheel.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    content = wheel.read_bytes()
    request = (
        f"POST /legacy/ HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(head) + len(content) + len(tail)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(request + head + content[: len(content) // 2])
    return sock


def test_killed_mid_upload_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    hub_data = HubData(data)
    hub_data.catalog.add_user("alice")
    token = hub_data.catalog.new_token("alice")
    package = write_env_package(tmp_path / "src")
    # 2 MiB that do not compress: the half sent is many of the server's reads, so it is surely
    # past the form's first field and streaming the file into tmp/ when the server is killed
    (package / "echo_env" / "blob.bin").write_bytes(random.Random(0).randbytes(2 << 20))
    wheel, sdist = build_dists(package, tmp_path / "dist")
    assert wheel.stat().st_size > 2 << 20
    project_files = data / "files" / ECHO

    with hub_process(data) as (url, proc):
        asyncio.run(upload(url, token, [sdist]))  # a file that is listed, and stays
        sock = _start_upload(url, token, wheel)
        try:
            wait_for(lambda: any((data / "tmp").iterdir()), 20, "the upload to reach tmp/")
            proc.kill()
            proc.wait(timeout=10)
        finally:
            sock.close()

    assert len(list((data / "tmp").iterdir())) == 1  # what the killed upload left
    catalog = Catalog(data / "hub.sqlite3")
    assert catalog.filenames() == {sdist.name}
    assert sorted(p.name for p in project_files.iterdir()) == [sdist.name, sdist.name + ".metadata"]

    # what a crash between the move and the commit leaves, a stray upload, a report no row names
    orphan = project_files / "palaestra_env_echo-0.3.0-py3-none-any.whl"
    orphan.write_bytes(b"not listed")
    orphan.with_name(orphan.name + ".metadata").write_text("Metadata-Version: 2.1\n")
    (data / "tmp" / uuid.uuid4().hex).write_bytes(b"half an upload")
    (data / "reports" / "77.html").write_text("<html></html>")

    printed: list[str] = []
    with hub_process(data, lines=printed) as (url, _):
        assert printed[0].strip() == "palaestra hub: WARNING: removed 5 files left by an interrupted upload"
        assert list((data / "tmp").iterdir()) == []
        assert list((data / "reports").iterdir()) == []
        assert sorted(p.name for p in project_files.iterdir()) == [sdist.name, sdist.name + ".metadata"]
        assert [f["filename"] for f in simple_files(url, ECHO)] == [sdist.name]
        assert get(f"{url}files/{ECHO}/{wheel.name}")[0] == 404
        assert get(f"{url}files/{ECHO}/{orphan.name}")[0] == 404

        done = asyncio.run(upload(url, token, [wheel]))  # the same file again: accepted now
        assert done == [{"filename": wheel.name, "name": ECHO, "version": "0.1.0"}]
        files = {f["filename"]: f for f in simple_files(url, ECHO)}
        assert set(files) == {wheel.name, sdist.name}
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert files[wheel.name]["hashes"] == {"sha256": digest}
        status, body, _ = get(f"{url}files/{ECHO}/{wheel.name}")
        assert status == 200 and body == wheel.read_bytes()
        assert list((data / "tmp").iterdir()) == []
    assert Catalog(data / "hub.sqlite3").filenames() == {wheel.name, sdist.name}


# 4. the static export, served by a plain file server, works with pip


@pytest.mark.slow  # a fresh venv and pip installs: over 10 s on its own
def test_static_export_works_with_pip(
    hub: dict[str, Any], attached: dict[str, Any], yanked: str, fresh: Path, tmp_path: Path
) -> None:
    out = tmp_path / "static"
    out.mkdir()
    with static_server(out) as static:
        done = palaestra("hub", "export", str(out), "--data", str(hub["data"]), "--url", static)
        assert re.fullmatch(r"wrote \d+ files to .*", done.stdout.strip())

        # pinned, the yanked 0.2.0; unpinned, the newest live one (the export keeps PEP 592 yanks)
        index = urljoin(static, "simple/")
        done = pip(fresh, "install", "--no-deps", "--force-reinstall", "--index-url", index, f"{ECHO}==0.2.0")
        assert f"{static}files/{ECHO}/palaestra_env_echo-0.2.0-py3-none-any.whl" in done.stdout
        assert version(fresh) == "0.2.0"
        done = pip(fresh, "install", "--no-deps", "--force-reinstall", "--index-url", index, ECHO)
        assert f"{static}files/{ECHO}/palaestra_env_echo-0.1.0-py3-none-any.whl" in done.stdout
        assert version(fresh) == "0.1.0"

        page_path = out / "env" / ECHO / "index.html"
        assert page_path.is_file()
        status, body, _ = get(f"{static}env/{ECHO}/")
        page = body.decode()
        assert status == 200 and page == page_path.read_text(encoding="utf-8")
        assert f"palaestra install {ECHO} --hub {static}" in page
        rows = leaderboard_rows(page)
        assert rows and rows[0][:3] == ["1", MODEL, "1.000"] and rows[0][4] == "8×1"
        links = report_links(page)
        assert len(links) == 1
        status, report, _ = get(urljoin(f"{static}env/{ECHO}/", links[0]))
        assert status == 200 and b'<iframe sandbox="allow-scripts"' in report


@pytest.mark.slow  # a fresh venv and pip installs: over 10 s on its own
def test_palaestra_install_from_a_static_export(
    hub: dict[str, Any], yanked: str, fresh: Path, tmp_path: Path
) -> None:
    """The export's index is HTML only: install reads it, yanks included, and pins its files."""
    out = tmp_path / "static"
    palaestra("hub", "export", str(out), "--data", str(hub["data"]))
    python = str(fresh / "bin" / "python")
    sha = {
        (f["filename"]): f["hashes"]["sha256"] for p in (ECHO, HELPER) for f in simple_files(hub["url"], p)
    }
    with static_server(out) as static:
        for requirement, want in (("echo==0.2.0", "0.2.0"), ("echo", "0.1.0")):  # a pinned yank, the newest
            done = palaestra("install", requirement, "--hub", static, "--python", python, "--no-deps")
            (line,) = done.stdout.splitlines()
            pins = sorted(shlex.split(line.removeprefix("ran: "))[-2:])
            assert pins == [
                f"{name} @ {static}files/{name}/{wheel}#sha256={sha[wheel]}"
                for name, wheel in (
                    (ECHO, f"palaestra_env_echo-{want}-py3-none-any.whl"),
                    (HELPER, "palaestra_env_helper-0.1.0-py3-none-any.whl"),
                )
            ]
            assert version(fresh) == want and version(fresh, HELPER) == "0.1.0"


# bad input through the CLI: one line on stderr, exit status 2, no traceback


def test_cli_bad_input(hub: dict[str, Any], published: dict[str, Any], tmp_path: Path) -> None:
    folder = str(published["folders"][1])

    line = one_line_error(palaestra("hub", "publish", folder, "--no-isolation", env=base_env(), check=False))
    assert "no hub given" in line and "PALAESTRA_HUB_URL" in line

    wrong = {**hub["env"], "PALAESTRA_HUB_TOKEN": "pah_not-a-token"}
    line = one_line_error(palaestra("hub", "publish", folder, "--no-isolation", env=wrong, check=False))
    assert "403" in line and "invalid or revoked API token" in line

    line = one_line_error(palaestra("install", "nosuchenv", "--dry-run", env=hub["env"], check=False))
    assert "palaestra-env-nosuchenv is not on the hub" in line

    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("hello")
    line = one_line_error(palaestra("hub", "results", str(not_a_run), env=hub["env"], check=False))
    assert "not a run directory" in line

    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    done = palaestra("hub", "export", str(full), "--data", str(hub["data"]), check=False)
    line = one_line_error(done)
    assert "not empty" in line
    assert [p.name for p in full.iterdir()] == ["keep.txt"]

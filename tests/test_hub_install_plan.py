"""What ``palaestra install`` plans from a hub's index, and how it refuses what it cannot use.

The index here is static PEP 503 HTML served by ``http.server`` (what ``palaestra hub export``
writes), with wheels made in place: extras, yanks, ``Requires-Python`` and requirements that
conflict. The CLI's refusals, from a hub that is down or not a hub to a name that is not one, are
each one line on stderr and exit status 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import answering_server, make_wheel, static_server, write_index

from palaestra.hub import index
from palaestra.hub.client import HubError, index_files
from palaestra.hub.install_plan import plan_install

_SCRIPT = Path(sys.executable).with_name("palaestra")
CLI = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "palaestra.cli"]
HELPER, CHART, VIZ = "palaestra-env-helper", "palaestra-env-chart", "palaestra-env-viz"
CLASH, YANK, NEWPY = "palaestra-env-clash", "palaestra-env-yank", "palaestra-env-newpy"


@pytest.fixture(scope="module")
def static(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A static index: chart has extras, viz needs chart[plot], clash needs two helpers at once."""
    tmp = tmp_path_factory.mktemp("static")
    wheels = tmp / "wheels"
    wheels.mkdir()

    def wheel(name: str, version: str, *requires: str, headers: tuple[str, ...] = ()) -> Path:
        module = name.removeprefix("palaestra-env-") + "_env"
        return make_wheel(
            wheels, name, version, {f"{module}/__init__.py": ""}, requires=requires, headers=headers
        )

    made = [
        wheel(HELPER, "0.1.0"),
        wheel(
            CHART,
            "0.1.0",
            "basedep",
            'plotdep>=2; extra == "plot"',
            f'{HELPER}; extra == "plot"',
            f'{CHART}[plot]; extra == "all"',  # an extra made of another one
            headers=("Provides-Extra: plot", "Provides-Extra: all"),
        ),
        wheel(VIZ, "0.1.0", f"{CHART}[Plot]>=0.1"),  # extras compare by their normalized names
        wheel(CLASH, "0.1.0", f"{HELPER}>=0.5", f"{CHART}[plot]"),  # chart[plot] then takes helper 0.1.0
        wheel(YANK, "0.1.0"),
        wheel(YANK, "0.2.0"),
        wheel(NEWPY, "0.1.0"),
        wheel(NEWPY, "0.2.0"),
    ]
    write_index(
        tmp / "index",
        made,
        metadata=True,
        yanked=frozenset({"palaestra_env_yank-0.2.0-py3-none-any.whl"}),
        requires_python={"palaestra_env_newpy-0.2.0-py3-none-any.whl": ">=3.99"},
    )
    with static_server(tmp / "index") as url:
        yield url


async def test_extras_add_their_requirements(static: str) -> None:
    """An extra, asked for on the command line or in a dependency, brings its requirements in."""
    plain = await plan_install(static, "chart")
    assert plain.hub == (f"{CHART}==0.1.0",) and plain.others == ("basedep",)
    plot = await plan_install(static, "chart[plot]")
    assert plot.hub == (f"{CHART}==0.1.0", f"{HELPER}==0.1.0")
    assert plot.others == ("basedep", "plotdep>=2")  # the marker, evaluated here, is not passed to pip
    viz = await plan_install(static, "viz")
    assert viz.hub == (f"{VIZ}==0.1.0", f"{CHART}==0.1.0", f"{HELPER}==0.1.0") and viz.others == plot.others
    nested = await plan_install(static, "chart[all]")
    assert nested.hub == plot.hub and nested.others == plot.others


async def test_an_extra_a_release_lacks_is_refused(static: str) -> None:
    with pytest.raises(HubError, match=rf"^{HELPER} 0\.1\.0 has no extra fast \(its extras: none\)$"):
        await plan_install(static, "helper[fast]")
    with pytest.raises(HubError, match=rf"^{CHART} 0\.1\.0 has no extra nope \(its extras: all, plot\)$"):
        await plan_install(static, "chart[plot,nope]")


async def test_requirements_that_conflict_are_refused(static: str) -> None:
    """clash needs helper>=0.5 and chart[plot], which takes helper 0.1.0: one version cannot be both."""
    with pytest.raises(
        HubError, match=rf"{HELPER}>=0\.5 is required, but {HELPER} 0\.1\.0 is already planned"
    ):
        await plan_install(static, "clash")


async def test_yanks_are_read_from_the_html_index(static: str) -> None:
    """PEP 592: a yanked release only when pinned, however the pin is spelled."""
    assert (await plan_install(static, "yank")).hub == (f"{YANK}==0.1.0",)
    assert (await plan_install(static, "yank==0.2")).hub == (f"{YANK}==0.2.0",)
    with pytest.raises(HubError, match=rf"no version of {YANK} on the hub matches >=0\.2 .*yanked: 1\)$"):
        await plan_install(static, "yank>=0.2")


async def test_requires_python_is_that_of_the_target(static: str) -> None:
    """newpy 0.2.0 needs Python 3.99: the newest release for this Python is 0.1.0."""
    assert (await plan_install(static, "newpy")).hub == (f"{NEWPY}==0.1.0",)
    future = await plan_install(static, "newpy", environment={"python_full_version": "3.99.1"})
    assert future.hub == (f"{NEWPY}==0.2.0",)
    with pytest.raises(HubError, match=rf"no version of {NEWPY} on the hub matches ==0\.2\.0 for Python 3\."):
        await plan_install(static, "newpy==0.2.0")


def _release(version: str, files: list[dict[str, object]], yanked: str | None = None) -> dict[str, object]:
    return {"version": version, "yanked": yanked is not None, "yanked_reason": yanked or "", "files": files}


def _file(filename: str, kind: str, requires_python: str = "") -> dict[str, object]:
    return {
        "filename": filename,
        "kind": kind,
        "sha256": "ab" * 32,
        "metadata_sha256": "cd" * 32,
        "requires_python": requires_python,
        "size": 10,
        "uploaded_at": "2025-01-01T00:00:00Z",
    }


async def test_the_html_index_reads_as_the_json_one() -> None:
    """The hub's two renderings of one project (a yank with a reason, Requires-Python, an sdist
    without core metadata) are read as the same files."""
    project = {
        "name": "palaestra-env-x",
        "releases": [
            _release("1.0", [_file("palaestra_env_x-1.0-py3-none-any.whl", "wheel", ">=3.8,<4")]),
            _release("1.1", [_file("palaestra_env_x-1.1+local.tar.gz", "sdist")], yanked="broken <b>"),
        ],
    }
    read = []
    for kind, media in (("json", index.JSON_TYPE), ("html", "text/html; charset=utf-8")):
        body, _ = index.project(project, kind)
        with answering_server(200, media, body) as url:
            files = await index_files(url, "palaestra-env-x")
        read.append([dataclasses.replace(f, url=f.url.removeprefix(url)) for f in files])
    assert read[0] == read[1]
    wheel, sdist = read[0]
    assert wheel.url == "files/palaestra-env-x/palaestra_env_x-1.0-py3-none-any.whl"
    assert (wheel.sha256, wheel.requires_python, wheel.metadata, wheel.yanked) == (
        "ab" * 32,
        ">=3.8,<4",
        True,
        False,
    )
    assert (
        sdist.filename == "palaestra_env_x-1.1+local.tar.gz"
        and sdist.url == f"files/palaestra-env-x/{sdist.filename}"
    )
    assert (sdist.metadata, sdist.yanked) == (False, True)


# the CLI's refusals

LOGIN = b"<!DOCTYPE html>\n<html>\n<body>\n<h1>Sign in</h1>\n<form></form>\n</body>\n</html>\n"
# a page that links a file whose core metadata is this same page (a server that answers anything)
WHEEL = "palaestra_env_helper-0.1.0-py3-none-any.whl"
ANYTHING = f'<a href="f/{WHEEL}#sha256={"ab" * 32}" data-core-metadata="true">{WHEEL}</a>'.encode()
CASES = {
    # name: (what answers at --hub, the command's arguments, what the line says)
    "hub-down": ("down", ["install", "helper"], "cannot reach the hub at http://127.0.0.1:"),
    "html-not-an-index": ((200, "text/html", LOGIN), ["install", "helper"], f"lists no files of {HELPER}"),
    "html-for-json": ((200, "text/html", LOGIN), ["hub", "search"], "did not answer the JSON a hub sends"),
    "html-error-page": ((502, "text/html", LOGIN), ["install", "helper"], ": 502 Bad Gateway"),
    "json-not-an-index": (
        (200, index.JSON_TYPE, b'{"files": 3}'),
        ["install", "helper"],
        "list of files cannot",
    ),
    "not-html-or-json": (
        (200, "image/png", b"\x89PNG"),
        ["install", "helper"],
        "answered image/png, not a package",
    ),
    "metadata-not-metadata": (
        (200, "text/html", ANYTHING),
        ["install", "helper"],
        "is not the core metadata of",
    ),
    "path-for-a-name": ("static", ["install", "../x"], "'../x' is not a requirement such as tictactoe"),
    "no-version-after-==": ("static", ["install", "foo=="], "'foo==' is not a requirement such as"),
    "a-url": ("static", ["install", "x @ http://127.0.0.1:9/x.whl"], "not a URL or marker"),
    "no-such-version": (
        "static",
        ["install", "helper==9.9"],
        f"no version of {HELPER} on the hub matches ==9.9",
    ),
    "no-such-project": ("static", ["install", "nothing"], "palaestra-env-nothing is not on the hub at"),
    "not-a-python": (
        "static",
        ["install", "helper", "--python", "{not_python}"],
        "is not a Python interpreter",
    ),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("case", list(CASES))
def test_each_refusal_is_one_line(static: str, tmp_path: Path, case: str) -> None:
    where, args, expected = CASES[case]
    not_python = tmp_path / "python"
    not_python.write_text("#!/bin/sh\necho hello\n")
    not_python.chmod(0o755)
    args = [a.replace("{not_python}", str(not_python)) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALAESTRA_HUB_")}
    fixed = {"down": f"http://127.0.0.1:{_free_port()}/", "static": static}
    server = answering_server(*where) if isinstance(where, tuple) else contextlib.nullcontext(fixed[where])
    with server as hub:
        done = subprocess.run(
            [*CLI, *args, "--hub", hub], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("palaestra: error: "), done.stderr
    assert expected in lines[0], lines[0]

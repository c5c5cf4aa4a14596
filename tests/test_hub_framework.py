"""palaestra itself on a hub: the one name outside ``palaestra-env-``, planned from the hub when an
environment needs it, and the install lines a page shows for a machine with no palaestra yet.

The install of palaestra's real wheel from a hub into a fresh venv is in ``test_release.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import make_wheel, static_server, write_index

from palaestra.hub import pages
from palaestra.hub.dist import DistError, check_project_name
from palaestra.hub.install_plan import plan_install
from palaestra.testing.hub import hub_process, write_env_package

ECHO = "palaestra-env-echo"


def test_palaestra_is_the_one_name_outside_the_prefix() -> None:
    assert check_project_name("palaestra") == "palaestra"
    assert check_project_name("Palaestra") == "palaestra"
    for name in ("palaestra-tools", "palaestra-env-", "numpy"):
        with pytest.raises(DistError, match="palaestra-env-"):
            check_project_name(name)


@pytest.fixture(scope="module")
def index_with_palaestra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A static index with palaestra 0.9.0 (needing aiohttp) and echo (needing palaestra>=0.5)."""
    tmp = tmp_path_factory.mktemp("index")
    wheels = tmp / "wheels"
    wheels.mkdir()
    made = [
        make_wheel(wheels, "palaestra", "0.9.0", {"palaestra/__init__.py": ""}, requires=("aiohttp>=3.9",)),
        make_wheel(wheels, ECHO, "0.1.0", {"echo_env/__init__.py": ""}, requires=("palaestra>=0.5", "rich")),
    ]
    write_index(tmp / "index", made, metadata=True)
    with static_server(tmp / "index") as url:
        yield url


async def test_an_environment_takes_palaestra_from_the_hub_that_serves_it(index_with_palaestra: str) -> None:
    plan = await plan_install(index_with_palaestra, "echo")
    assert plan.hub == (f"{ECHO}==0.1.0", "palaestra==0.9.0")
    assert set(plan.others) == {"rich", "aiohttp>=3.9"}  # palaestra's own dependencies: pip's index


async def test_a_palaestra_already_installed_that_satisfies_is_kept(index_with_palaestra: str) -> None:
    kept = await plan_install(index_with_palaestra, "echo", installed={"palaestra": "0.6.0"})
    assert kept.hub == (f"{ECHO}==0.1.0",) and kept.others == ("rich",)
    too_old = await plan_install(index_with_palaestra, "echo", installed={"palaestra": "0.1.0"})
    assert "palaestra==0.9.0" in too_old.hub


async def test_without_palaestra_on_the_hub_it_comes_from_pips_index(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels, ECHO, "0.1.0", {"echo_env/__init__.py": ""}, requires=("palaestra",))
    write_index(tmp_path / "index", [wheel], metadata=True)
    with static_server(tmp_path / "index") as url:
        plan = await plan_install(url, "echo")
    assert plan.hub == (f"{ECHO}==0.1.0",) and plan.others == ("palaestra",)


def test_a_page_says_how_to_install_with_no_palaestra_when_the_hub_serves_it() -> None:
    release = {
        "version": "0.1.0",
        "yanked": False,
        "files": [],
        "environments": ["echo"],
        "summary": "",
        "requires_dist": [],
        "requires_python": "",
        "eval_defaults": {},
        "description": "",
        "description_content_type": "",
        "keywords": [],
        "project_urls": [],
        "license": "",
        "created_at": "2026-01-01T00:00:00Z",
        "yanked_reason": None,
    }
    project = {"name": ECHO, "display_name": ECHO, "owner": "alice", "releases": [release]}
    url = "http://hub.example/"
    without = pages.project(project, [], hub_url=url)
    assert f"palaestra install {ECHO} --hub {url}" in without and "--no-deps" not in without
    wheel = ("palaestra-0.1.0-py3-none-any.whl", "ab" * 32)
    served = pages.project(project, [], hub_url=url, palaestra_wheel=wheel)
    pin = f"palaestra @ {url}files/palaestra/{wheel[0]}#sha256={wheel[1]}"
    bootstrap = f"pip install --no-deps &quot;{pin}&quot; &amp;&amp; pip install palaestra"
    assert bootstrap in served
    assert served.index(bootstrap) < served.index(f"palaestra install {ECHO} --hub {url}")


def test_publish_checks_the_token_before_building(tmp_path: Path) -> None:
    folder = write_env_package(tmp_path)
    pyproject = folder / "pyproject.toml"  # a build would fail at once: the token must be refused first
    pyproject.write_text(pyproject.read_text().replace('"hatchling.build"', '"no_such_backend"'))
    data = tmp_path / "hub-data"
    with hub_process(data) as (url, _):
        env = {**os.environ, "PALAESTRA_HUB_URL": url, "PALAESTRA_HUB_TOKEN": "pah_not-a-token"}
        done = subprocess.run(
            [sys.executable, "-m", "palaestra.cli", "hub", "publish", str(folder)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "403" in line and "token" in line and "build" not in line and len(line.splitlines()) == 1

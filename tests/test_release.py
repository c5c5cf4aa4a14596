"""palaestra as a release: the wheel and sdist ``python -m build`` makes pass ``twine check`` and
carry the package data, and the wheel, served by a hub, installs into a fresh venv in which an
evaluation, an SFT step and ``palaestra hub serve`` run.

The fresh venv has no palaestra source checkout anywhere on its path: palaestra comes from the
hub (the exact file the environment page's install line names), its third-party dependencies
and the extras' from the machine's own package index, and the environment from the hub through
``palaestra install``. Every command runs outside the repository.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.hub.client import upload
from palaestra.runner import run_async
from palaestra.testing.hub import build_dists, hub_process

REPO = Path(__file__).resolve().parent.parent
EXTRAS = "datasets,local,serve,train,tensorboard,wandb,mcp,hub,gymnasium,reasoning-gym,textarena,ray"


def run(
    command: list[str] | str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command,
        shell=isinstance(command, str),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    shown = command if isinstance(command, str) else shlex.join(command)
    assert done.returncode == 0, (
        f"{shown} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """palaestra's wheel and sdist, built from this checkout with ``python -m build``."""
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)])
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_and_sdist_pass_twine_check(dists: dict[str, Path]) -> None:
    pytest.importorskip("twine")
    done = run([sys.executable, "-m", "twine", "check", "--strict", str(dists["wheel"]), str(dists["sdist"])])
    assert done.stdout.count("PASSED") == 2


def test_the_version_is_one_and_in_the_changelog(dists: dict[str, Path]) -> None:
    version = pa.__version__
    assert dists["wheel"].name == f"palaestra-{version}-py3-none-any.whl"
    assert dists["sdist"].name == f"palaestra-{version}.tar.gz"
    with zipfile.ZipFile(dists["wheel"]) as z:
        assert f"\nVersion: {version}\n" in z.read(f"palaestra-{version}.dist-info/METADATA").decode()
    assert re.search(rf"^## {re.escape(version)}\b", (REPO / "CHANGELOG.md").read_text(), re.M)


def test_the_wheel_carries_every_file_of_the_package(dists: dict[str, Path]) -> None:
    tracked = run(["git", "ls-files", "palaestra"], cwd=REPO).stdout.split()
    with zipfile.ZipFile(dists["wheel"]) as z:
        members = set(z.namelist())
    missing = [path for path in tracked if path not in members]
    assert not missing, f"not in the wheel: {missing}"
    for asset in (
        "palaestra/eval/report_assets/report.js",
        "palaestra/hub/assets/hub.js",
        "palaestra/templates/multiturn_environment.py.tmpl",
        "palaestra/py.typed",
    ):
        assert asset in members


def test_the_sdist_has_the_package_docs_and_changelog_only(dists: dict[str, Path]) -> None:
    top = dists["sdist"].name.removesuffix(".tar.gz")
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.removeprefix(top + "/") for n in tar.getnames()}
    for path in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "mkdocs.yml",
        "docs/releasing.md",
        "palaestra/__init__.py",
        "palaestra/_version.py",
        "palaestra/eval/report_assets/report.css",
    ):
        assert path in names, path
    assert not [
        n for n in names if n.startswith((".venv", "environments/", "examples/", "outputs/", ".git/"))
    ]


# -- a fresh venv with only the hub and a package index ------------------------------------------


def fresh_env(venv: Path) -> dict[str, str]:
    """The environment of a shell in ``venv``: its bin first, no repository or palaestra on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PALAESTRA_HUB_URL", "PALAESTRA_HUB_TOKEN")
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        OMP_NUM_THREADS="1",
        PYTHONNOUSERSITE="1",
        HF_HUB_OFFLINE="1",
    )
    return env


def install_lines(page: str) -> list[str]:
    """The shell lines of an environment page's install box, comments dropped."""
    box = page.split("<h2>Install</h2>", 1)[1].split("</code></pre>", 1)[0].split("<code>", 1)[1]
    lines = [html.unescape(line).split("    #")[0].strip() for line in box.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def fresh(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A hub with palaestra's wheel and reverse_text on it, and a fresh venv installed from its page."""
    tmp = tmp_path_factory.mktemp("fresh")
    data = tmp / "hub-data"
    token = run([sys.executable, "-m", "palaestra.cli", "hub", "token", "alice", "--data", str(data)])
    env_dists = build_dists(REPO / "environments" / "reverse_text", tmp / "env-dist")
    with hub_process(data) as (url, _):
        run_async(upload(url, token.stdout.strip(), [dists["wheel"], dists["sdist"], *env_dists]))
        with urllib.request.urlopen(f"{url}env/palaestra-env-reverse-text/", timeout=30) as response:
            lines = install_lines(response.read().decode())
        venv = tmp / "venv"
        run([sys.executable, "-m", "venv", str(venv)])
        env = fresh_env(venv)
        work = tmp / "work"
        work.mkdir()
        bootstrap, install = lines[0], lines[1]  # palaestra with no palaestra yet; then the environment
        assert bootstrap.startswith("pip install --no-deps") and install.startswith("palaestra install")
        run(bootstrap, env=env, cwd=work)
        run(install, env=env, cwd=work)
        constraints = str(REPO / "constraints.txt")  # torch's CPU build, as ./dev installs it
        run(["pip", "install", "-q", "-c", constraints, "palaestra[train]"], env=env, cwd=work)
        yield {"venv": venv, "env": env, "work": work, "url": url, "lines": lines}


@pytest.mark.slow  # a fresh venv with torch in it: about a minute
def test_palaestra_in_the_venv_is_the_hubs_wheel(fresh: dict[str, Any], dists: dict[str, Path]) -> None:
    code = (
        "import json, palaestra, importlib.metadata as m; d = m.distribution('palaestra'); "
        "print(json.dumps([palaestra.__file__, d.version, d.read_text('direct_url.json')]))"
    )
    path, version, direct_url = json.loads(
        run(["python", "-c", code], env=fresh["env"], cwd=fresh["work"]).stdout
    )
    assert Path(path).is_relative_to(fresh["venv"]) and version == pa.__version__
    assert json.loads(direct_url)["url"].endswith(f"files/palaestra/{dists['wheel'].name}")


@pytest.mark.slow
def test_every_extra_resolves_in_the_venv(fresh: dict[str, Any]) -> None:
    constraints = str(REPO / "constraints.txt")
    run(
        ["pip", "install", "--dry-run", "-q", "-c", constraints, f"palaestra[{EXTRAS}]"],
        env=fresh["env"],
        cwd=fresh["work"],
    )


@pytest.mark.slow
def test_an_eval_and_its_report_run_from_the_wheel(fresh: dict[str, Any]) -> None:
    env, work = fresh["env"], fresh["work"]
    run(
        [
            "palaestra",
            "eval",
            "reverse_text",
            "-m",
            "scripted:reverse_text:oracle",
            "-n",
            "2",
            "-r",
            "1",
            "-o",
            "out",
            "--quiet",
        ],
        env=env,
        cwd=work,
    )
    (run_dir,) = (p.parent for p in (work / "out" / "evals").glob("*/*/metadata.json"))
    assert json.loads((run_dir / "metadata.json").read_text())["summary"]["reward"]["mean"] == 1.0
    run(["palaestra", "report", str(run_dir)], env=env, cwd=work)
    report = (run_dir / "report.html").read_text()
    assert "<style>" in report and "reverse_text" in report  # the bundled assets, inlined


@pytest.mark.slow
def test_an_sft_step_runs_from_the_wheel(fresh: dict[str, Any]) -> None:
    env, work = fresh["env"], fresh["work"]
    chats = work / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}]}
        for w in ("cat", "dog", "bird", "tree")
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "sft.toml").write_text(f"""
[data]
path = "{chats}"
max_length = 64

[model.tiny]
vocab_size = 300
hidden_size = 32
intermediate_size = 64
num_layers = 1
max_positions = 64

[train]
steps = 1
batch_size = 2
micro_batch_tokens = 256
threads = 1

[output]
dir = "sft-run"
""")
    run(["palaestra", "train", "sft", "sft.toml", "--quiet"], env=env, cwd=work)
    assert (work / "sft-run" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_hub_serve_and_init_run_from_the_wheel(fresh: dict[str, Any]) -> None:
    env, work = fresh["env"], fresh["work"]
    proc = subprocess.Popen(
        ["palaestra", "hub", "serve", "--data", "hub", "--port", "0"],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        while not (found := re.search(r"at (http://\S+/)", seen[-1] if seen else "")):
            seen.append(proc.stdout.readline())
            assert seen[-1], f"the hub did not start: {''.join(seen)}"
        for path in ("", "static/hub.js", "simple/"):
            with urllib.request.urlopen(found.group(1) + path, timeout=30) as response:
                assert response.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    run(["palaestra", "init", "guess", "--kind", "multiturn", "--path", "envs"], env=env, cwd=work)
    assert (work / "envs" / "guess" / "tests" / "test_guess_env.py").is_file()  # the templates are bundled


@pytest.mark.slow
def test_the_environment_page_shows_the_install_lines_in_chromium(
    fresh: dict[str, Any], tmp_path: Path
) -> None:
    """What a person copies from the page: the lines the fresh venv was installed with."""
    from browser import chrome
    from selenium.webdriver.common.by import By

    driver = chrome(tmp_path, console_log=True)
    try:
        driver.get(f"{fresh['url']}env/palaestra-env-reverse-text/")
        box = driver.find_element(By.CSS_SELECTOR, "aside pre code").text
        shown = [
            line.split("    #")[0].strip() for line in box.splitlines() if line and not line.startswith("#")
        ]
        assert shown == fresh["lines"]  # the very lines the fresh venv was installed with
        assert "no palaestra yet" in box
        errors = [
            e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]
        ]
        assert not errors, errors
    finally:
        driver.quit()

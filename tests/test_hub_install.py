"""``palaestra install`` takes the hub's packages from the hub alone, whatever pip is told elsewhere.

A hostile second index on 127.0.0.1 serves ``palaestra-env-echo`` and ``palaestra-env-helper``
at the hub's versions, with a more specific wheel tag (so pip prefers them) and another payload.
pip's variables and config files of every level point at it: ``PIP_EXTRA_INDEX_URL``,
``PIP_FIND_LINKS``, the ``PIP_CONFIG_FILE`` file, the user's files (``HOME``, ``XDG_CONFIG_HOME``),
the global one (``XDG_CONFIG_DIRS``) and the venv's. It is also the user's own index
(``PIP_INDEX_URL``), which serves the dependencies that are not on the hub. Plain pip in this setup
installs the hostile files (checked first: the attack is real); ``palaestra install`` installs the
hub's, which the tests check by importing them and by the sha256 pip recorded for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
from package_index import make_wheel, static_server, write_index
from packaging.markers import default_environment

from palaestra.hub.client import HubError, upload
from palaestra.hub.data import HubData
from palaestra.hub.install import PipCommand, inspect_target, install
from palaestra.hub.install_plan import plan_install
from palaestra.testing.hub import build_dists, hub_process, write_env_package

_SCRIPT = Path(sys.executable).with_name("palaestra")
CLI = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "palaestra.cli"]
ECHO, HELPER, GREEDY = "palaestra-env-echo", "palaestra-env-helper", "palaestra-env-greedy"
# the hostile wheels' tag: pip ranks it above the hub's py3-none-any
HOSTILE_TAG = f"py{sys.version_info.major}{sys.version_info.minor}-none-any"
HOSTILE = 'ORIGIN = "hostile"\n'
# every way of pointing pip at another index that the tests try
VECTORS = ("extra_index_var", "find_links_var", "config_file", "user_config", "user_legacy", "global", "venv")


# packages and indexes


def hub_package(src: Path, name: str, module: str, dependencies: tuple[str, ...]) -> Path:
    folder = write_env_package(
        src, name=name, module=module, env_name=module.removesuffix("_env"), dependencies=dependencies
    )
    (folder / module / "__init__.py").write_text('ORIGIN = "hub"\n', encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hub (a child process) with echo, helper and greedy; the hostile index beside it."""
    tmp = tmp_path_factory.mktemp("indexes")
    src, dist = tmp / "src", tmp / "dist"
    hub_wheels = {}
    for name, module, deps in [
        (HELPER, "helper_env", ()),
        (ECHO, "echo_env", (f"{HELPER}>=0.1", "tinydep")),
        (GREEDY, "greedy_env", ("sneakydep", f"{HELPER}; sys_platform == 'plan9'")),
    ]:
        hub_wheels[name] = build_dists(hub_package(src, name, module, deps), dist / name)
    hostile = tmp / "hostile-wheels"
    hostile.mkdir()
    write_index(
        tmp / "hostile",
        [
            make_wheel(hostile, ECHO, "0.1.0", {"echo_env/__init__.py": HOSTILE}, tag=HOSTILE_TAG),
            make_wheel(hostile, HELPER, "0.1.0", {"helper_env/__init__.py": HOSTILE}, tag=HOSTILE_TAG),
            make_wheel(hostile, "tinydep", "1.0", {"tinydep.py": "X = 1\n"}, requires=(HELPER,)),
            make_wheel(
                hostile, "sneakydep", "1.0", {"sneakydep.py": "X = 1\n"}, requires=("palaestra-env-sneaky",)
            ),
            make_wheel(hostile, "palaestra-env-sneaky", "1.0", {"sneaky_env/__init__.py": HOSTILE}),
        ],
    )
    data = tmp / "hub-data"
    hub_data = HubData(data)
    hub_data.catalog.add_user("alice")
    token = hub_data.catalog.new_token("alice")
    with hub_process(data) as (hub, _), static_server(tmp / "hostile") as other:
        for paths in hub_wheels.values():
            asyncio.run(upload(hub, token, paths))
        sha = {name: hashlib.sha256(paths[0].read_bytes()).hexdigest() for name, paths in hub_wheels.items()}
        yield {"hub": hub, "hostile": other, "hostile_dir": tmp / "hostile", "sha": sha}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with only pip in it (pip 22.2 or newer, for its reports)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=180)
    return venv


# the user's machine


@contextlib.contextmanager
def machine(
    indexes: dict[str, Any], fresh: Path, tmp: Path, vectors: tuple[str, ...] = (), **extra: str
) -> Iterator[dict[str, str]]:
    """An environment whose pip is pointed at the hostile index by each of ``vectors``.

    Nothing of this machine's own pip settings takes part; the user's own index is the hostile
    one, so what is not on the hub comes from there (and nothing leaves 127.0.0.1).
    """
    other = indexes["hostile"]
    conf = f"[global]\nextra-index-url = {other}simple/\n"
    home, etc = tmp / "home", tmp / "etc-xdg"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PALAESTRA_HUB_", "XDG_"))}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CONFIG_DIRS=str(etc),
        XDG_CACHE_HOME=str(tmp / "cache"),
        PIP_INDEX_URL=f"{other}simple/",
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_DEFAULT_TIMEOUT="20",
        PALAESTRA_HUB_URL=indexes["hub"],
        **extra,
    )
    files = {
        "config_file": tmp / "hostile.conf",
        "user_config": home / ".config" / "pip" / "pip.conf",
        "user_legacy": home / ".pip" / "pip.conf",
        "global": etc / "pip" / "pip.conf",
        "venv": fresh / "pip.conf",
    }
    for vector in vectors:
        if vector == "extra_index_var":
            env["PIP_EXTRA_INDEX_URL"] = f"{other}simple/"
        elif vector == "find_links_var":
            env["PIP_FIND_LINKS"] = str(indexes["hostile_dir"] / "files")
        else:
            files[vector].parent.mkdir(parents=True, exist_ok=True)
            files[vector].write_text(conf, encoding="utf-8")
            if vector == "config_file":
                env["PIP_CONFIG_FILE"] = str(files[vector])
    try:
        yield env
    finally:
        files["venv"].unlink(missing_ok=True)  # the venv is shared by the module's tests


def run(command: list[str], env: dict[str, str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    if check and done.returncode != 0:
        raise AssertionError(f"{shlex.join(command)} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def pip(fresh: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run([str(fresh / "bin" / "python"), "-m", "pip", *args], env)


def origins(fresh: Path, *names: str) -> dict[str, Any]:
    """For each project: what its module says it is, and the sha256 of the file pip installed it from."""
    code = (
        "import importlib, importlib.metadata as m, json, sys\nout = {}\n"
        "for name in sys.argv[1:]:\n"
        "    d = m.distribution(name)\n"
        "    module = importlib.import_module(name.removeprefix('palaestra-env-') + '_env')\n"
        "    direct = json.loads(d.read_text('direct_url.json') or '{}')\n"
        "    out[name] = [module.ORIGIN, direct.get('archive_info', {}).get('hashes', {}).get('sha256')]\n"
        "print(json.dumps(out))"
    )
    done = run([str(fresh / "bin" / "python"), "-c", code, *names], {**os.environ, "PYTHONPATH": ""})
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def install_hostile(fresh: Path, indexes: dict[str, Any], env: dict[str, str]) -> None:
    """Plain pip with the hostile index as an extra one: its echo and helper win (same version, better tag)."""
    hub = urljoin(indexes["hub"], "simple/")
    other = urljoin(indexes["hostile"], "simple/")
    args = f"--index-url {hub} --extra-index-url {other} {ECHO}==0.1.0 {HELPER}==0.1.0"
    pip(fresh, env, "install", "--no-deps", "--force-reinstall", *args.split())
    assert origins(fresh, ECHO, HELPER) == {ECHO: ["hostile", None], HELPER: ["hostile", None]}


def palaestra(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([*CLI, *args], env, check=check)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("palaestra: error: "), done.stderr
    return lines[0]


# the attack is real


@pytest.mark.slow  # a fresh venv and pip runs: over 10 s on its own
@pytest.mark.parametrize("vector", VECTORS)
def test_each_setting_makes_plain_pip_take_the_hostile_file(
    indexes: dict[str, Any], fresh: Path, tmp_path: Path, vector: str
) -> None:
    """pip told to use the hub's index only still takes the hostile wheel when one setting names the other."""
    with machine(indexes, fresh, tmp_path, (vector,)) as env:
        index = urljoin(indexes["hub"], "simple/")
        pip(
            fresh,
            env,
            "download",
            "--no-deps",
            "-d",
            str(tmp_path / "got"),
            "--index-url",
            index,
            f"{ECHO}==0.1.0",
        )
    assert [p.name for p in (tmp_path / "got").iterdir()] == [f"palaestra_env_echo-0.1.0-{HOSTILE_TAG}.whl"]


@pytest.mark.slow  # a fresh venv and pip runs: over 10 s on its own
def test_plain_pip_installs_the_hostile_files(indexes: dict[str, Any], fresh: Path, tmp_path: Path) -> None:
    with machine(indexes, fresh, tmp_path) as env:
        install_hostile(fresh, indexes, env)


@pytest.mark.slow  # a fresh venv and pip runs: over 10 s on its own
def test_a_second_plain_pip_call_replaces_a_hub_package(
    indexes: dict[str, Any], fresh: Path, tmp_path: Path
) -> None:
    """The hub's helper installed, then the other dependencies from the user's index (which forces
    reinstalls): without the hub's files named, pip takes helper again, from there."""
    with machine(indexes, fresh, tmp_path, PIP_FORCE_REINSTALL="1") as env:
        palaestra(env, "install", "helper", "--python", str(fresh / "bin" / "python"))
        assert origins(fresh, HELPER) == {HELPER: ["hub", indexes["sha"][HELPER]]}
        pip(fresh, env, "install", "tinydep")
        assert origins(fresh, HELPER) == {HELPER: ["hostile", None]}


# palaestra install takes the hub's files


@pytest.mark.slow  # a fresh venv and pip runs: over 10 s on its own
@pytest.mark.parametrize(
    "vectors",
    [
        ("extra_index_var", "find_links_var", "config_file", "global", "venv"),
        ("extra_index_var", "find_links_var", "user_config", "user_legacy", "global", "venv"),
    ],
    ids=["config-file", "user-config"],  # pip reads the user's files only without PIP_CONFIG_FILE
)
def test_install_takes_the_hubs_files(
    indexes: dict[str, Any], fresh: Path, tmp_path: Path, vectors: tuple[str, ...]
) -> None:
    """Every setting pointing at the hostile index, the hostile files already installed at the same
    versions, and the user's pip forcing reinstalls: the hub's files are what is installed."""
    python = str(fresh / "bin" / "python")
    with machine(indexes, fresh, tmp_path, vectors, PIP_FORCE_REINSTALL="1") as env:
        install_hostile(fresh, indexes, env)
        planned = palaestra(env, "install", "echo", "--python", python, "--dry-run").stdout.splitlines()
        done = palaestra(env, "install", "echo", "--python", python).stdout.splitlines()
    assert origins(fresh, ECHO, HELPER) == {
        ECHO: ["hub", indexes["sha"][ECHO]],
        HELPER: ["hub", indexes["sha"][HELPER]],
    }
    assert run([python, "-c", "import tinydep"], env).returncode == 0  # from the user's own index
    # --dry-run printed the very commands that ran
    assert [line.removeprefix("would run: ") for line in planned] == [
        line.removeprefix("ran: ") for line in done
    ]
    assert len(done) == 2 and all(line.startswith("ran: ") for line in done), done
    hub_call, others = (shlex.split(line.removeprefix("ran: ")) for line in done)
    pins = sorted(
        f"{name} @ {indexes['hub']}files/{name}/{name.replace('-', '_')}-0.1.0-py3-none-any.whl"
        f"#sha256={indexes['sha'][name]}"
        for name in (ECHO, HELPER)
    )
    assert hub_call[:5] == [f"PIP_CONFIG_FILE={os.devnull}", python, "-m", "pip", "install"]
    assert "--isolated" in hub_call and "--no-index" in hub_call and sorted(hub_call[-2:]) == pins
    assert others[:4] == [python, "-m", "pip", "install"] and "--isolated" not in others
    assert others[4] == "tinydep" and sorted(others[5:]) == pins


@pytest.mark.slow  # a fresh venv and pip runs: over 10 s on its own
def test_the_printed_hub_command_is_safe_on_its_own(
    indexes: dict[str, Any], fresh: Path, tmp_path: Path
) -> None:
    """The hub's line of ``--dry-run``, pasted into a shell where every setting names the hostile index."""
    vectors = ("extra_index_var", "find_links_var", "config_file", "global", "venv")
    with machine(indexes, fresh, tmp_path, vectors) as env:
        install_hostile(fresh, indexes, env)
        done = palaestra(env, "install", "helper", "--python", str(fresh / "bin" / "python"), "--dry-run")
        (line,) = done.stdout.splitlines()
        run(["bash", "-c", line.removeprefix("would run: ")], env)
    assert origins(fresh, HELPER) == {HELPER: ["hub", indexes["sha"][HELPER]]}


@pytest.mark.slow  # a fresh venv and pip runs: over 10 s on its own
def test_a_palaestra_env_package_from_another_index_is_refused(
    indexes: dict[str, Any], fresh: Path, tmp_path: Path
) -> None:
    """greedy needs sneakydep, from the user's index, which needs palaestra-env-sneaky: not the hub's."""
    with machine(indexes, fresh, tmp_path) as env:
        done = palaestra(env, "install", "greedy", "--python", str(fresh / "bin" / "python"), check=False)
    line = one_line_error(done)
    assert "palaestra-env-sneaky 1.0 from outside the hub" in line
    assert f"{fresh / 'bin' / 'python'} -m pip uninstall palaestra-env-sneaky" in line


# checks that need no venv


def fake_python(tmp: Path, report: dict[str, Any], dists: dict[str, Any]) -> str:
    """An interpreter whose pip succeeds without doing anything: it reports ``report`` and
    inspecting it finds ``dists`` (what a pip that went wrong would leave)."""
    script = tmp / "python"
    inspect = {"environment": default_environment(), "dists": dists}
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\nargs = sys.argv[1:]\n"
        f"if args[0] == '-c':\n    print(json.dumps({inspect!r}))\n"
        f"elif '--report' in args:\n"
        f"    open(args[args.index('--report') + 1], 'w').write(json.dumps({report!r}))\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return str(script)


def report_of(url: str, sha256: str) -> dict[str, Any]:
    item = {
        "metadata": {"name": HELPER, "version": "0.1.0"},
        "download_info": {"url": url, "archive_info": {"hashes": {"sha256": sha256}}},
    }
    return {"version": "1", "install": [item]}


def test_a_file_the_hub_does_not_list_is_refused(indexes: dict[str, Any], tmp_path: Path) -> None:
    hub, sha = indexes["hub"], indexes["sha"][HELPER]
    good = f"{hub}files/{HELPER}/palaestra_env_helper-0.1.0-py3-none-any.whl"
    hostile = f"{indexes['hostile']}files/palaestra_env_helper-0.1.0-{HOSTILE_TAG}.whl"
    for report in (report_of(hostile, sha), report_of(good, "0" * 64)):
        python = fake_python(tmp_path, report, {})
        with pytest.raises(
            HubError, match=r"pip chose palaestra_env_helper-0\.1\.0-.*: not a file the hub lists"
        ):
            install(hub, "helper", python=python, no_deps=True)
    # pip said it took the hub's file, but what is installed came from elsewhere
    elsewhere = json.dumps({"url": hostile, "archive_info": {"hashes": {"sha256": "1" * 64}}})
    python = fake_python(
        tmp_path, report_of(good, sha), {HELPER: {"version": "0.1.0", "direct_url": elsewhere}}
    )
    with pytest.raises(
        HubError, match=f"{HELPER} in .* is not the hub's palaestra_env_helper-0.1.0-py3-none-any"
    ):
        install(hub, "helper", python=python, no_deps=True)
    # --dry-run installs and checks nothing, and prints the hub's file pinned by its hash
    (command,) = install(hub, "helper", python=python, dry_run=True)
    assert command.argv[-1] == f"{HELPER} @ {good}#sha256={sha}"


def test_the_hub_call_reads_no_pip_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_FIND_LINKS", "/elsewhere")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/elsewhere/pip.conf")
    isolated = PipCommand(
        ("python", "-m", "pip", "install", "--isolated", "x @ http://hub/x.whl#sha256=00"), True
    )
    env = isolated.env()
    assert env is not None and env["PIP_CONFIG_FILE"] == os.devnull
    assert not [k for k in env if k.upper().startswith("PIP_") and k != "PIP_CONFIG_FILE"]
    assert env["PATH"] == os.environ["PATH"]
    assert shlex.split(str(isolated)) == [f"PIP_CONFIG_FILE={os.devnull}", *isolated.argv]
    assert PipCommand(("python", "-m", "pip", "install", "rich")).env() is None  # the user's own settings


async def test_markers_are_those_of_the_target_interpreter(indexes: dict[str, Any]) -> None:
    """greedy needs helper on plan9 only: an install into a plan9 Python takes it, one into this one does not."""
    assert inspect_target(sys.executable).environment == default_environment()
    here = await plan_install(indexes["hub"], "greedy", environment=default_environment())
    assert here.hub == (f"{GREEDY}==0.1.0",) and here.others == ("sneakydep",)
    plan9 = await plan_install(
        indexes["hub"], "greedy", environment={**default_environment(), "sys_platform": "plan9"}
    )
    assert plan9.hub == (f"{GREEDY}==0.1.0", f"{HELPER}==0.1.0")


def test_an_interpreter_that_cannot_run_is_one_line(indexes: dict[str, Any], tmp_path: Path) -> None:
    env = {**os.environ, "PALAESTRA_HUB_URL": indexes["hub"]}
    line = one_line_error(
        palaestra(env, "install", "helper", "--python", str(tmp_path / "nope"), check=False)
    )
    assert f"cannot run {tmp_path / 'nope'}" in line

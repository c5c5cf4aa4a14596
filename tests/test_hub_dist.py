"""palaestra.hub.dist: what the hub reads from an uploaded wheel or sdist, and what it refuses."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from palaestra.hub import dist
from palaestra.hub.dist import DistError, check_project_name, inspect_dist, normalize

README = "# Demo\n\nA demo environment for the hub's tests.\n"
PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "0.2.0"
description = "A demo environment"
readme = "README.md"
requires-python = ">=3.11"
license = "MIT"
keywords = ["demo", "games"]
dependencies = ["palaestra>=0.1"]

[project.urls]
Homepage = "https://example.org/demo"

[project.entry-points."palaestra.environments"]
demo = "demo:load_environment"

[tool.hatch.build.targets.wheel]
packages = ["demo"]

[tool.palaestra.eval]
num_examples = 7
"""
METADATA = """\
Metadata-Version: 2.4
Name: {name}
Version: {version}
Summary: A demo environment

Long description.
"""
ENTRY_POINTS = "[palaestra.environments]\ndemo = demo:load_environment\n"
WHEEL = "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
INIT = "def load_environment():  # UNIQUE-MARKER\n    return None\n"
WHEEL_NAME = "palaestra_env_demo-0.2.0-py3-none-any.whl"
SDIST_NAME = "palaestra_env_demo-0.2.0.tar.gz"


def build(root: Path, name: str) -> tuple[Path, Path]:
    """Build the demo package as ``name`` with hatchling (offline); return its wheel and sdist."""
    pkg, out = root / "src", root / "dist"
    (pkg / "demo").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT.format(name=name))
    (pkg / "README.md").write_text(README)
    (pkg / "demo" / "__init__.py").write_text(INIT)
    cmd = [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-t", "sdist", "-d", str(out)]
    subprocess.run(cmd, cwd=pkg, check=True, capture_output=True)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build(tmp_path_factory.mktemp("demo"), "palaestra-env-demo")


def wheel_members(name: str = "palaestra-env-demo", version: str = "0.2.0") -> dict[str, str]:
    """A minimal valid wheel's members, by name."""
    info = "palaestra_env_demo-0.2.0.dist-info"
    return {
        "demo/__init__.py": INIT,
        f"{info}/METADATA": METADATA.format(name=name, version=version),
        f"{info}/WHEEL": WHEEL,
        f"{info}/entry_points.txt": ENTRY_POINTS,
        f"{info}/RECORD": "",
    }


def write_wheel(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


SDIST_PYPROJECT = """\
[project]
name = "palaestra-env-demo"

[project.entry-points."palaestra.environments"]
demo = "demo:load_environment"
"""


def sdist_members(pyproject: str = SDIST_PYPROJECT) -> dict[str, str]:
    """A minimal valid sdist's members, by path under its top folder."""
    return {
        "PKG-INFO": METADATA.format(name="palaestra-env-demo", version="0.2.0"),
        "pyproject.toml": pyproject,
        "demo/__init__.py": INIT,
    }


def write_sdist(
    path: Path,
    members: dict[str, str],
    top: str = "palaestra_env_demo-0.2.0",
    links: dict[str, str] | None = None,
) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return path


def refused(path: Path, *fragments: str, filename: str | None = None) -> str:
    with pytest.raises(DistError) as caught:
        inspect_dist(path, filename=filename)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message
    return message


# --- the real distributions -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_built_distribution(built: tuple[Path, Path], kind: str) -> None:
    path = built[0] if kind == "wheel" else built[1]
    info = inspect_dist(path)
    assert info.filename == (WHEEL_NAME if kind == "wheel" else SDIST_NAME)
    assert info.kind == kind
    assert (info.name, info.display_name, info.version) == (
        "palaestra-env-demo",
        "palaestra-env-demo",
        "0.2.0",
    )
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.size == path.stat().st_size
    assert info.metadata.startswith(b"Metadata-Version")
    assert info.summary == "A demo environment"
    assert README in info.description
    assert info.description_content_type == "text/markdown"
    assert info.keywords == ("demo", "games")
    assert info.requires_dist == ("palaestra>=0.1",)
    assert info.requires_python == ">=3.11"
    assert info.environments == ("demo",)
    assert info.eval_defaults == ({} if kind == "wheel" else {"num_examples": 7})
    assert info.project_urls == (("Homepage", "https://example.org/demo"),)
    assert info.license == "MIT"
    hash(info)  # eval_defaults is a dict, yet DistInfo stays hashable


def test_filename_given_separately(built: tuple[Path, Path], tmp_path: Path) -> None:
    upload = tmp_path / "upload.tmp"  # how a server holds an upload: its own name on disk
    upload.write_bytes(built[0].read_bytes())
    assert inspect_dist(upload, filename=WHEEL_NAME).filename == WHEEL_NAME


def test_truncated_wheel(built: tuple[Path, Path], tmp_path: Path) -> None:
    data = built[0].read_bytes()
    (tmp_path / WHEEL_NAME).write_bytes(data[: len(data) // 2])
    refused(tmp_path / WHEEL_NAME, "not a valid wheel")


def test_truncated_sdist(built: tuple[Path, Path], tmp_path: Path) -> None:
    data = built[1].read_bytes()
    (tmp_path / SDIST_NAME).write_bytes(data[: len(data) // 2])
    refused(tmp_path / SDIST_NAME, "not a valid sdist")


def test_name_without_prefix(tmp_path: Path) -> None:
    wheel, _ = build(tmp_path, "demo-env")
    refused(wheel, "'palaestra-env-'", "'palaestra-env-demo-env'")


# --- hand-made wheels: each case changes one thing of a valid one --------------------------------


def test_hand_made_wheel_passes(tmp_path: Path) -> None:
    info = inspect_dist(write_wheel(tmp_path / WHEEL_NAME, wheel_members()))
    assert (info.name, info.version, info.environments) == ("palaestra-env-demo", "0.2.0", ("demo",))
    assert (info.description, info.keywords, info.eval_defaults) == ("Long description.\n", (), {})


def test_older_metadata_fields(tmp_path: Path) -> None:
    members = wheel_members()
    members[f"{INFO}/METADATA"] = (
        "Metadata-Version: 1.2\nName: Palaestra_Env.Demo\nVersion: 0.2\nKeywords: a b  c\n"
        "License: MIT License\nProject-URL: https://example.org\n"
        "Description: First line.\n        |  indented\n        last\n"
    )
    info = inspect_dist(write_wheel(tmp_path / WHEEL_NAME, members))
    assert (info.name, info.display_name, info.version) == ("palaestra-env-demo", "Palaestra_Env.Demo", "0.2")
    assert (info.keywords, info.license) == (("a", "b", "c"), "MIT License")
    assert info.project_urls == (("", "https://example.org"),)
    assert info.description == "First line.\n  indented\nlast"
    assert (info.summary, info.requires_dist, info.requires_python, info.description_content_type) == (
        "",
        (),
        "",
        "",
    )


def _members(change: Callable[[dict[str, str]], object]) -> dict[str, str]:
    members = wheel_members()
    change(members)
    return members


INFO = "palaestra_env_demo-0.2.0.dist-info"


@pytest.mark.parametrize(
    ("members", "fragments"),
    [
        pytest.param(
            _members(lambda m: m.pop(f"{INFO}/entry_points.txt")),
            ["no palaestra.environments entry point", '[project.entry-points."palaestra.environments"]'],
            id="no-entry-points",
        ),
        pytest.param(
            _members(
                lambda m: m.update({f"{INFO}/entry_points.txt": "[console_scripts]\ndemo = demo:main\n"})
            ),
            ["no palaestra.environments entry point"],
            id="other-group-only",
        ),
        pytest.param(
            _members(
                lambda m: m.update(
                    {f"{INFO}/entry_points.txt": "[palaestra.environments]\ndemo = not valid\n"}
                )
            ),
            ["bad palaestra.environments entry point 'demo'"],
            id="bad-entry-point",
        ),
        pytest.param(
            wheel_members(version="0.3.0"),
            ["metadata says palaestra-env-demo 0.3.0", "0.2.0"],
            id="version-mismatch",
        ),
        pytest.param(
            wheel_members(name="palaestra-env-other"),
            ["metadata says palaestra-env-other", "palaestra-env-demo"],
            id="name-mismatch",
        ),
        pytest.param(wheel_members(name="demo"), ["'palaestra-env-demo'"], id="metadata-name-without-prefix"),
        pytest.param(wheel_members(version="zero"), ["Invalid version: 'zero'"], id="invalid-version"),
        pytest.param(
            wheel_members(version="9" * 5000), ["METADATA: Exceeds the limit"], id="version-too-long"
        ),
        pytest.param(_members(lambda m: m.update({"../evil.py": ""})), ["'../evil.py'", "'..'"], id="dotdot"),
        pytest.param(
            _members(lambda m: m.update({"/etc/evil": ""})), ["'/etc/evil'", "absolute"], id="absolute"
        ),
        pytest.param(
            _members(lambda m: m.pop(f"{INFO}/WHEEL")), ["must contain METADATA and WHEEL"], id="no-WHEEL"
        ),
        pytest.param(
            _members(lambda m: m.update({"other-1.0.dist-info/METADATA": ""})),
            ["exactly one top-level *.dist-info"],
            id="two-dist-infos",
        ),
        pytest.param(
            _members(
                lambda m: m.update({f"{INFO}/METADATA": "Metadata-Version: 2.4\nName: palaestra-env-demo\n"})
            ),
            ["METADATA lacks the required field(s) Version"],
            id="no-version",
        ),
    ],
)
def test_wheel_refused(tmp_path: Path, members: dict[str, str], fragments: list[str]) -> None:
    refused(write_wheel(tmp_path / WHEEL_NAME, members), *fragments)


def test_wheel_with_a_flipped_byte(tmp_path: Path) -> None:
    path = write_wheel(tmp_path / WHEEL_NAME, wheel_members())  # stored, not compressed: INIT is in the file
    data = bytearray(path.read_bytes())
    data[data.index(b"UNIQUE-MARKER")] ^= 0xFF
    path.write_bytes(bytes(data))
    refused(path, "not a valid wheel: corrupt member demo/__init__.py", "CRC")


def test_member_too_large_to_read(tmp_path: Path) -> None:
    path = write_wheel(tmp_path / WHEEL_NAME, wheel_members())
    with pytest.raises(
        DistError, match=f"member {INFO}/METADATA is 1.. bytes decompressed; the hub takes at most 100"
    ):
        inspect_dist(path, limits=dist.Limits(member_bytes=100))


@pytest.mark.parametrize(
    ("filename", "fragment"),
    [
        ("palaestra_env_demo-0.2.0.zip", "only wheels (.whl) and sdists (.tar.gz)"),
        ("palaestra_env_demo-0.2.0-py3-none-any.egg", "only wheels (.whl) and sdists (.tar.gz)"),
        ("dir/" + WHEEL_NAME, "not a plain file name"),
        ("." + WHEEL_NAME, "not a plain file name"),
        ("demo.whl", "invalid wheel file name"),
        ("palaestra_env_demo.tar.gz", "invalid sdist file name"),
        ("demo_env-0.2.0-py3-none-any.whl", "'palaestra-env-demo-env'"),
        # a tag may be any string to packaging: the hub takes only what a file name is made of
        ("palaestra_env_demo-0.2.0-py3-none-<img src=x>.whl", "not a plain file name"),
        ("palaestra_env_demo-0.2.0-py3-none-a\x00.whl", "not a plain file name"),
        ("palaestra_env_demo-0.2.0-py3-none-\udcff.whl", "not a plain file name"),
        ("palaestra_env_demo-0.2.0-py3-none-\u00e9.whl", "not a plain file name"),
        ("palaestra_env_demo-0.2.0-py3-none-" + "a" * 250 + ".whl", "in at most 240 characters"),
    ],
)
def test_bad_filenames(tmp_path: Path, filename: str, fragment: str) -> None:
    path = write_wheel(tmp_path / WHEEL_NAME, wheel_members())
    refused(path, fragment, filename=filename)


# --- hand-made sdists ----------------------------------------------------------------------------


def test_hand_made_sdist_passes(tmp_path: Path) -> None:
    info = inspect_dist(write_sdist(tmp_path / SDIST_NAME, sdist_members()))
    assert (info.kind, info.environments, info.eval_defaults) == ("sdist", ("demo",), {})


@pytest.mark.parametrize(
    ("members", "top", "fragments"),
    [
        pytest.param(
            sdist_members('[project]\nname = "palaestra-env-demo"\n'),
            "palaestra_env_demo-0.2.0",
            [
                "sdist's pyproject.toml declares no palaestra.environments entry point",
                "[project.entry-points.",
            ],
            id="no-entry-points",
        ),
        pytest.param(
            sdist_members(SDIST_PYPROJECT + "[tool.palaestra]\neval = 3\n"),
            "palaestra_env_demo-0.2.0",
            ["[tool.palaestra.eval] must be a table"],
            id="eval-not-a-table",
        ),
        pytest.param(
            {**sdist_members(), "pyproject.toml": "[project\n"},
            "palaestra_env_demo-0.2.0",
            ["cannot be read"],
            id="bad-toml",
        ),
        pytest.param(
            {k: v for k, v in sdist_members().items() if k != "PKG-INFO"},
            "palaestra_env_demo-0.2.0",
            ["must contain palaestra_env_demo-0.2.0/PKG-INFO"],
            id="no-PKG-INFO",
        ),
        pytest.param(sdist_members(), "", ["exactly one top-level folder"], id="no-top-folder"),
        pytest.param(sdist_members(), "../x", ["'../x/PKG-INFO'"], id="dotdot"),
    ],
)
def test_sdist_refused(tmp_path: Path, members: dict[str, str], top: str, fragments: list[str]) -> None:
    refused(write_sdist(tmp_path / SDIST_NAME, members, top=top), *fragments)


def test_sdist_links(tmp_path: Path) -> None:
    inside = write_sdist(tmp_path / SDIST_NAME, sdist_members(), links={"demo/readme": "../PKG-INFO"})
    assert inspect_dist(inside).environments == ("demo",)
    outside = write_sdist(tmp_path / SDIST_NAME, sdist_members(), links={"passwd": "../../etc/passwd"})
    refused(outside, "link palaestra_env_demo-0.2.0/passwd -> ../../etc/passwd points outside the sdist")


# --- names --------------------------------------------------------------------------------------


def test_normalize() -> None:
    assert normalize("Palaestra_Env.Foo") == "palaestra-env-foo"
    assert normalize("palaestra--env__demo") == "palaestra-env-demo"


def test_check_project_name() -> None:
    assert check_project_name("Palaestra_Env.Foo") == "palaestra-env-foo"
    assert check_project_name("palaestra-env-x") == "palaestra-env-x"
    for name, suggestion in [
        ("palaestra-envfoo", "palaestra-env-envfoo"),
        ("foo", "palaestra-env-foo"),
        ("palaestra-env-", "palaestra-env-foo"),
        ("palaestra_foo", "palaestra-env-foo"),
        ("palaestra-env-foo!", "palaestra-env-foo"),
        ("palaestra-env-foo\n", "palaestra-env-foo"),
        ("", "palaestra-env-foo"),
    ]:
        with pytest.raises(DistError) as caught:
            check_project_name(name)
        assert "'palaestra-env-'" in str(caught.value) and repr(suggestion) in str(caught.value)

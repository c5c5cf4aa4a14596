"""palaestra.scaffold: `palaestra init` makes a package that imports, runs and passes its own test."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

import palaestra as pa
from palaestra.scaffold import KINDS, TEMPLATES, create_environment, environment_names

REPO = Path(__file__).resolve().parents[1]


def import_from(path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import a generated module from its file, without installing it (removed again after the test)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, module)
    spec.loader.exec_module(module)
    return module


def run_pytest(test_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider"],
        cwd=test_file.parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_creates_the_package_files(tmp_path: Path) -> None:
    root = create_environment("word-count", tmp_path / "envs")
    assert root == tmp_path / "envs" / "word_count"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["README.md", "pyproject.toml", "tests/test_word_count_env.py", "word_count.py"]
    for path in root.rglob("*.*"):
        assert "{{" not in path.read_text(), f"unfilled marker in {path}"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["name"] == "palaestra-env-word-count"
    assert project["dependencies"] == ["palaestra"]
    assert project["entry-points"]["palaestra.environments"] == {"word_count": "word_count:load_environment"}
    assert "# word-count" in (root / "README.md").read_text()


async def test_a_tool_environment_is_generated_with_its_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = create_environment("country-tools", tmp_path, "tool")
    module = import_from(root / "country_tools.py", monkeypatch)
    env = module.load_environment()
    assert isinstance(env, pa.ToolEnv) and [t["function"]["name"] for t in env.tools] == ["country_facts"]
    readme = (root / "README.md").read_text()
    assert "`palaestra init country-tools --kind tool`" in readme and "| `max_turns` |" in readme
    with pytest.raises(ValueError, match="unknown kind 'chat': choose one of single, multiturn, tool"):
        create_environment("other", tmp_path, "chat")


async def test_a_multiturn_environment_is_a_game_a_perfect_player_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = create_environment("guess-game", tmp_path, "multiturn")
    module = import_from(root / "guess_game.py", monkeypatch)
    env = module.load_environment(num_examples=4)
    assert isinstance(env, pa.MultiTurnEnv) and type(env).__name__ == "GuessGameEnv"
    assert env.metric_info()["turns_used"] == {"weight": 0.0, "higher_is_better": False}
    rollouts = await env.run(pa.ScriptedClient(module.bisect), pa.RunSpec(rollouts_per_example=2))
    assert len(rollouts) == 8 and all(r.reward == 1.0 and r.stop_reason == "won" for r in rollouts)
    assert len({r.state["secret"] for r in rollouts}) > 1  # each game its own number, from state.rng
    readme = (root / "README.md").read_text()
    assert "`palaestra init guess-game --kind multiturn`" in readme and "palaestra play guess_game" in readme


def test_names_with_hyphens_become_modules_with_underscores() -> None:
    names = environment_names("my-env_2")
    assert (names.name, names.module, names.package) == ("my-env_2", "my_env_2", "palaestra-env-my-env-2")
    assert environment_names("chess").package == "palaestra-env-chess"


async def test_generated_environment_runs_with_a_scripted_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = create_environment("capitals_quiz", tmp_path)
    module = import_from(root / "capitals_quiz.py", monkeypatch)
    env = module.load_environment()
    assert isinstance(env, pa.SingleTurnEnv)
    answers = {row["question"]: row["answer"] for row in module.DATASET}

    def oracle(messages: pa.Messages) -> str:
        return f"<answer>{answers[messages[-1]['content']]}</answer>"

    rollouts = await env.run(pa.ScriptedClient(oracle), pa.RunSpec(rollouts_per_example=2))
    assert len(rollouts) == 2 * len(answers) > 0
    assert all(r.error is None and r.reward == 1.0 for r in rollouts)
    assert all(r.metrics["format_reward"] == 1.0 for r in rollouts)
    wrong = await env.run(pa.ScriptedClient(lambda messages: "<answer>Atlantis</answer>"))
    assert all(r.error is None and r.reward == 0.0 for r in wrong)


@pytest.mark.parametrize("kind", list(KINDS))
def test_generated_test_passes_as_generated_and_fails_when_the_reward_breaks(
    tmp_path: Path, kind: str
) -> None:
    root = create_environment("capitals-quiz", tmp_path, kind)
    test_file = root / "tests" / "test_capitals_quiz_env.py"
    result = run_pytest(test_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{3 if kind == 'multiturn' else 2} passed" in result.stdout

    module = root / "capitals_quiz.py"
    reward = 'return 1.0 if state["won"]' if kind == "multiturn" else "return 1.0 if parsed"
    assert reward in module.read_text()
    module.write_text(module.read_text().replace(reward, reward.replace("1.0", "0.0")))
    broken = run_pytest(test_file)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "1 failed" in broken.stdout


@pytest.mark.parametrize("kind", list(KINDS))
def test_generated_code_is_lint_clean(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("ruff")
    root = create_environment("lint-me", tmp_path, kind)
    config = str(REPO / "pyproject.toml")
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--config", config, str(root)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "name", ["", "1abc", "Word", "my env", "a.b", "café", "trailing-", "trailing_", "-lead", "a/b"]
)
def test_invalid_names_raise(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="invalid environment name"):
        create_environment(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "reason"),
    [("class", "keyword"), ("json", "shadow"), ("palaestra", "shadow"), ("pytest", "importable")],
)
def test_names_that_would_shadow_a_module_raise(tmp_path: Path, name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        create_environment(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_never_overwrites(tmp_path: Path) -> None:
    root = create_environment("mine", tmp_path)
    module = root / "mine.py"
    module.write_text("# my edits\n")
    with pytest.raises(FileExistsError, match="already exists"):
        create_environment("mine", tmp_path)
    assert module.read_text() == "# my edits\n"

    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError):
        create_environment("other", tmp_path)
    assert list((tmp_path / "other").iterdir()) == []


def test_parent_must_be_a_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        create_environment("mine", tmp_path / "file")


def test_every_template_ships_with_the_package(tmp_path: Path) -> None:
    templates = REPO / "palaestra" / "templates"
    assert sorted(p.name for p in templates.iterdir()) == sorted(TEMPLATES)
    # build the real wheel: `palaestra init` from a pip install must find its templates
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("palaestra-*.whl")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("palaestra/templates/")}
    assert shipped == {f"palaestra/templates/{name}" for name in TEMPLATES}

"""palaestra.registry: environments found through the `palaestra.environments` entry points.

The first tests use the bundled packages (`./dev setup` installs them; by hand:
`pip install -e environments/reverse_text -e environments/double_check`). The rest register
throwaway environments through real entry points: a `.dist-info` folder on `sys.path`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import palaestra as pa
from palaestra.registry import installed_environments

BUNDLED = ("reverse_text", "double_check", "tictactoe", "sql_quiz", "wiki_search")


@pytest.fixture(scope="module", autouse=True)
def bundled_installed() -> None:
    missing = [name for name in BUNDLED if name not in installed_environments()]
    assert not missing, f"not installed: {missing}; run `./dev setup` or `pip install -e environments/NAME`"


def test_installed_environments_lists_the_bundled_packages() -> None:
    found = installed_environments()
    assert set(BUNDLED) <= set(found)
    assert found["reverse_text"].value == "reverse_text:load_environment"
    assert found["double_check"].value == "double_check:load_environment"


def test_load_reverse_text_with_arguments() -> None:
    env = pa.load_environment("reverse_text", num_examples=5)
    assert isinstance(env, pa.SingleTurnEnv)
    assert len(env.examples) == 5
    assert env.examples[0].answer == env.examples[0].prompt[-1]["content"][::-1]


def test_load_the_tool_environments() -> None:
    for name in ("sql_quiz", "wiki_search"):
        env = pa.load_environment(name)
        assert isinstance(env, pa.ToolEnv) and env.tools, name
    assert isinstance(pa.load_environment("sql_quiz", num_examples=2), pa.StatefulToolEnv)


def test_load_double_check() -> None:
    env = pa.load_environment("double_check", num_examples=3, seed=1)
    assert isinstance(env, pa.MultiTurnEnv) and not isinstance(env, pa.SingleTurnEnv)
    assert len(env.examples) == 3
    assert len(pa.load_environment("double_check").examples) == 1000  # the package's default


@pytest.mark.parametrize("name", ["reverse-text", "Reverse_Text", " reverse_text "])
def test_names_are_normalised(name: str) -> None:
    assert len(pa.load_environment(name, num_examples=2).examples) == 2


def test_unknown_name_lists_the_installed_ones() -> None:
    with pytest.raises(pa.EnvironmentNotFound) as caught:
        pa.load_environment("reverse_txt")
    message = str(caught.value)
    assert "'reverse_txt'" in message
    assert "reverse_text" in message and "double_check" in message


def test_unknown_argument_names_it_and_the_accepted_ones() -> None:
    with pytest.raises(pa.EnvironmentArgsError) as caught:
        pa.load_environment("reverse_text", num_exmples=5)
    message = str(caught.value)
    assert "num_exmples" in message
    for accepted in ("num_examples", "seed", "system_prompt"):
        assert accepted in message


def test_bad_argument_values_raise_the_environments_own_error() -> None:
    with pytest.raises(ValueError, match="num_examples"):
        pa.load_environment("double_check", num_examples=0)


def register(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_name: str, source: str) -> None:
    """Install a one-file environment ``fake_env`` under the entry point ``entry_name``, for this test."""
    (tmp_path / "fake_env.py").write_text(source)
    dist = tmp_path / "palaestra_fake_env-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: palaestra-fake-env\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        f"[palaestra.environments]\n{entry_name} = fake_env:load_environment\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_env", raising=False)


FAKE_ENV = """
import palaestra as pa

def load_environment(**kwargs):
    rows = [{"question": str(kwargs), "answer": ""}]
    return pa.SingleTurnEnv(dataset=rows)
"""


def test_entry_point_names_are_normalised_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register(tmp_path, monkeypatch, "Fake-Env", FAKE_ENV)
    assert "fake_env" in installed_environments()
    env = pa.load_environment("fake_env")
    assert isinstance(env, pa.SingleTurnEnv)


def test_a_factory_taking_kwargs_gets_every_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register(tmp_path, monkeypatch, "fake_env", FAKE_ENV)
    env = pa.load_environment("fake-env", level=3, mode="hard")
    assert env.examples[0].prompt[-1]["content"] == "{'level': 3, 'mode': 'hard'}"


def test_a_factory_must_return_an_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register(tmp_path, monkeypatch, "fake_env", "def load_environment():\n    return 'not an env'\n")
    with pytest.raises(TypeError, match="fake_env:load_environment returned str, not an Environment"):
        pa.load_environment("fake_env")


def test_a_missing_required_argument_is_an_args_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = "def load_environment(path, size=1):\n    raise AssertionError('never called')\n"
    register(tmp_path, monkeypatch, "fake_env", source)
    with pytest.raises(
        pa.EnvironmentArgsError, match=r"missing a required argument: 'path'.*takes: path, size"
    ):
        pa.load_environment("fake_env", size=2)

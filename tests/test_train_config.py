"""The generic config loader: TOML + ``--section.key VALUE`` overrides into frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from palaestra.train.config import ConfigError, load_config, parse_overrides, to_toml
from palaestra.train.sft_config import SFTConfig


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    names: tuple[str, ...] = ("a", "b")
    mode: Literal["x", "y"] = "x"
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"rate must be at least 0, got {self.rate}")


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner = field(default_factory=Inner)
    extra: Inner | None = None
    flag: bool = False


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_toml_and_overrides_build_typed_frozen_config(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "run"\n[inner]\nrate = 1\nnames = ["q"]\n')
    overrides = parse_overrides(
        ["--inner.mode", "y", "--inner.limit=3", "--extra.rate", "2", "--flag", "true"]
    )
    config = load_config(Outer, path, overrides)
    assert config == Outer("run", Inner(1.0, ("q",), "y", 3), Inner(rate=2.0), True)
    assert isinstance(config.inner.rate, float)
    with pytest.raises(AttributeError):
        config.name = "other"  # type: ignore[misc]  # frozen on purpose


def test_written_toml_reads_back_equal(tmp_path: Path) -> None:
    config = Outer('a "quoted" name\n', Inner(rate=1e-7, names=("x",), limit=None), Inner(mode="y"), True)
    assert load_config(Outer, write(tmp_path, to_toml(config))) == config


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        ('name = "r"\nnmae = 1', [], "unknown key nmae (the config has: name, inner, extra, flag)"),
        ('name = "r"\n[inner]\nrat = 1', [], "unknown key inner.rat (inner has: rate, names, mode, limit)"),
        ('name = "r"', ["--inner.rat", "1"], "unknown key --inner.rat"),
        ('name = "r"', ["--nope.rate", "1"], "unknown section --nope"),
        ("", [], "missing key name"),
        ("name = 3", [], "name must be a string, got 3 (int)"),
        ('name = "r"\n[inner]\nrate = "fast"', [], 'inner.rate must be a number, got "fast" (str)'),
        ('name = "r"', ["--inner.rate", "fast"], "--inner.rate must be a number, got 'fast'"),
        ('name = "r"', ["--inner.limit", "1.5"], "inner.limit must be an integer or none, got 1.5 (float)"),
        ('name = "r"', ["--inner.mode", "z"], 'inner.mode must be one of "x", "y", got "z" (str)'),
        ('name = "r"', ["--flag", "1"], "flag must be true or false, got 1 (int)"),
        ('name = "r"', ["--inner.names", "[1]"], "inner.names[0] must be a string, got 1 (int)"),
        ('name = "r"', ["--inner.rate", "-1"], "inner: rate must be at least 0, got -1.0"),
        ('name = "r"\ninner = 3', [], "inner must be a table, got 3 (int)"),
        ('name = "r"\n[inner', [], "is not valid TOML"),
    ],
)
def test_bad_configs_are_one_clear_line(
    tmp_path: Path, text: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(Outer, write(tmp_path, text), parse_overrides(overrides))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_override_syntax_errors() -> None:
    with pytest.raises(ConfigError, match="needs a value"):
        parse_overrides(["--optim.lr"])
    with pytest.raises(ConfigError, match=r"expected --section\.key VALUE"):
        parse_overrides(["lr", "1"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Outer, "/no/such/config.toml")


def test_none_on_the_command_line_clears_an_optional_table(tmp_path: Path) -> None:
    path = write(tmp_path, '[data]\npath = "d"\n[model.tiny]\nhidden_size = 64\n')
    config = load_config(
        SFTConfig, path, parse_overrides(["--model.tiny", "none", "--model.path", "smollm2"])
    )
    assert config.model.tiny is None and config.model.path == "smollm2"


def test_sft_config_cross_checks(tmp_path: Path) -> None:
    path = write(tmp_path, '[data]\npath = "d"\n[model]\npath = "m"\n')
    assert load_config(SFTConfig, path).optim.betas == (0.9, 0.95)
    with pytest.raises(ConfigError, match="give exactly one of path"):
        load_config(SFTConfig, path, {"model.tiny.hidden_size": "64"})
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        load_config(SFTConfig, path, {"train.micro_batch_tokens": "100", "data.max_length": "512"})

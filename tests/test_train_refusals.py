"""Bad input to ``palaestra train sft|rl`` is one line and exit 2, found before anything is written:
non-finite or out-of-range numbers in any section, a bad field inside ``[model.tiny]``, a device
this torch does not have. No refusal leaves anything in ``output.dir``, so the re-run with the
value fixed starts at once (never "output.dir is not empty")."""

from __future__ import annotations

import dataclasses
import json
import shutil
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from palaestra.cli import main
from palaestra.testing.train_smoke import REVERSE_TEXT_ARGS
from palaestra.testing.train_smoke import rl_toml as tiny_rl_toml
from palaestra.train.config import ConfigError, load_config
from palaestra.train.rl_config import RLConfig
from palaestra.train.sft_config import SFTConfig

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = "vocab_size = 300\nhidden_size = 32\nintermediate_size = 64\nnum_layers = 1\nmax_positions = 256\n"


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "games.jsonl"
    rows = [
        {
            "messages": [
                {
                    "role": "system",
                    "content": "Play tic-tac-toe. Reply <think>...</think> then <move>N</move>.",
                },
                {"role": "user", "content": "Free cells: 0, 1, 2. Your move."},
                {
                    "role": "assistant",
                    "content": f"<think>Cell {i % 3} is free.</think>\n<move>{i % 3}</move>",
                },
            ]
        }
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_toml(tmp_path: Path, games: Path, model: str = f"[model.tiny]\n{TINY}") -> Path:
    path = tmp_path / "sft.toml"
    path.write_text(f"""
[data]
path = "{games}"
max_length = 256
{model}
[optim]
lr = 1e-3
[train]
steps = 2
batch_size = 4
micro_batch_tokens = 1024
threads = 1
[output]
dir = "{tmp_path / "run"}"
""")
    return path


def rl_toml(tmp_path: Path, model: str) -> Path:
    return tiny_rl_toml(
        tmp_path / "rl.toml",
        None,
        tmp_path / "run",
        "reverse_text",
        REVERSE_TEXT_ARGS,
        model_table=model,
        max_tokens=8,
        steps=1,
        lr=1e-3,
        eval="",
        output="sample_every = 0",
    )


@pytest.fixture(params=["sft", "rl"])
def trainer(
    request: pytest.FixtureRequest, tmp_path: Path, games: Path, tiny_model_dir: Path
) -> tuple[str, Path]:
    """(``sft`` or ``rl``, a config that trains in a second)."""
    if request.param == "sft":
        return "sft", sft_toml(tmp_path, games)
    return "rl", rl_toml(tmp_path, f'[model]\npath = "{tiny_model_dir}"\n')


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *fragments: str) -> None:
    """``err`` is one error line (and, in a test process, transformers' progress bars: the command
    turns them off before transformers is first imported, which here was long before)."""
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line]
    assert len(lines) == 1 and lines[0].startswith("palaestra: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], err


def nothing_in(run_dir: Path) -> bool:
    return not run_dir.exists() or not any(run_dir.iterdir())


# --- every number of every section --------------------------------------------------------------


def numeric_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, type)`` of every float, int and tuple-of-floats field in a config, tables included."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint, key = hints[field.name], prefix + field.name
        options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        inner = next((o for o in options if dataclasses.is_dataclass(o)), None)
        if inner is not None:
            yield from numeric_keys(inner, key + ".")
        elif hint in (int, float) or (typing.get_origin(hint) is tuple and float in typing.get_args(hint)):
            yield key, hint


BASES = {
    SFTConfig: '[data]\npath = "d"\nmax_length = 256\n[model.tiny]\nmax_positions = 256\n',
    RLConfig: '[model]\npath = "m"\n',
}
FLOATS = [(cls, key) for cls in BASES for key, hint in numeric_keys(cls) if hint is not int]
INTS = [(cls, key) for cls in BASES for key, hint in numeric_keys(cls) if hint is int]


@pytest.mark.parametrize(("cls", "key"), FLOATS, ids=[f"{c.__name__}.{k}" for c, k in FLOATS])
@pytest.mark.parametrize("bad", ["inf", "-inf", "nan", "1e400"])
def test_every_float_of_every_section_must_be_finite(tmp_path: Path, cls: type, key: str, bad: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASES[cls])
    tuple_field = key.endswith("betas")
    with pytest.raises(ConfigError) as caught:
        load_config(cls, path, {key: f"[{bad}, 0.9]" if tuple_field else bad})
    assert f"{key}{'[0]' if tuple_field else ''} must be a finite number" in str(caught.value)


@pytest.mark.parametrize(("cls", "key"), INTS, ids=[f"{c.__name__}.{k}" for c, k in INTS])
def test_every_integer_must_fit_in_64_bits(tmp_path: Path, cls: type, key: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASES[cls])
    with pytest.raises(ConfigError, match=rf"{key} must be an integer between -2\*\*63 and 2\*\*63 - 1"):
        load_config(cls, path, {key: str(2**63)})


@pytest.mark.parametrize(
    ("cls", "overrides", "fragment"),
    [
        (SFTConfig, {"optim.lr": "2"}, "lr must be in [0, 1], got 2.0"),
        (SFTConfig, {"optim.weight_decay": "1e300"}, "0 <= weight_decay <= 1"),
        (SFTConfig, {"optim.eps": "5"}, "eps in (0, 1]"),
        (SFTConfig, {"train.seed": "-1"}, "train: seed must be between 0 and"),
        (SFTConfig, {"model.tiny.seed": str(2**63 - 1)}, None),  # the largest seed is fine
        (SFTConfig, {"model.tiny.initializer_range": "-1"}, "initializer_range must be in (0, 1]"),
        (SFTConfig, {"model.tiny.max_positions": "0"}, "max_positions must be between 1 and"),
        (
            SFTConfig,
            {"model.tiny.attention_window": "0"},
            "attention_window must be between 1 and 256, got 0",
        ),
        (SFTConfig, {"model.tiny.vocab_size": "10000000000"}, "model.tiny: vocab_size must be between 1 and"),
        (SFTConfig, {"model.tiny.hidden_size": "65536"}, "more than a tiny model's 1,000,000,000"),
        (SFTConfig, {"model.tiny.max_positions": "128"}, "model.tiny.max_positions (128) must be at least"),
        (SFTConfig, {"lora.rank": "99999999999"}, "lora: rank must be between 1 and 4,096"),
        (SFTConfig, {"lora.alpha": "-5"}, "alpha must be between 1 and"),
        (RLConfig, {"sampling.max_tokens": str(2**31)}, "max_tokens must be an integer in [1, 2**31)"),
        (RLConfig, {"train.rollouts_per_example": "1", "train.batch_size": "4"}, "at least 2, got 1"),
        (RLConfig, {"train.seed": str(2**63 - 1)}, None),
        (RLConfig, {"loss.eps_low": "1.5"}, "0 <= eps_low < 1"),
        (RLConfig, {"eval.temperature": "1000"}, "0 <= temperature < 100"),
        (RLConfig, {"eval.sets": '[{name = "../../elsewhere"}]'}, "a folder name under RUN_DIR/evals/"),
        (RLConfig, {"eval.sets": '[{name = "/tmp/x"}]'}, "a folder name under RUN_DIR/evals/"),
        (RLConfig, {"eval.sets": '[{name = "a"}, {name = "a"}]'}, "two eval sets are named 'a'"),
    ],
)
def test_numbers_out_of_their_sane_range_are_refused(
    tmp_path: Path, cls: type, overrides: dict[str, str], fragment: str | None
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASES[cls])
    if fragment is None:
        load_config(cls, path, overrides)
        return
    with pytest.raises(ConfigError) as caught:
        load_config(cls, path, overrides)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


# --- through the command line: one line, exit 2, nothing written --------------------------------


@pytest.mark.parametrize("lr", ["1e400", "inf", "nan", "-1e-3"])
def test_a_learning_rate_that_overflows_is_refused_by_both_trainers(
    capsys: pytest.CaptureFixture[str], trainer: tuple[str, Path], lr: str
) -> None:
    kind, config = trainer
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet", "--optim.lr", lr)
    assert code == 2
    one_error_line(err, "optim.lr" if lr != "-1e-3" else "lr must be in [0, 1]")
    assert not (config.parent / "run").exists()


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('hidden_size = "x"', 'model.tiny.hidden_size must be an integer, got "x" (str)'),
        ("hiden_size = 32", "unknown key model.tiny.hiden_size (model.tiny has: vocab_size, hidden_size,"),
        ("hidden_size = -32", "model.tiny: hidden_size must be between 1 and"),
        ("initializer_range = nan", "model.tiny.initializer_range must be a finite number, got nan"),
    ],
)
def test_a_bad_field_inside_model_tiny_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, games: Path, table: str, fragment: str
) -> None:
    lines = [line for line in TINY.splitlines() if line.split(" = ")[0] not in table] + [table]
    for kind, config in (
        ("sft", sft_toml(tmp_path, games, "[model.tiny]\n" + "\n".join(lines) + "\n")),
        ("rl", rl_toml(tmp_path, "[model.tiny]\n" + "\n".join(lines) + "\n")),
    ):
        code, _, err = run_cli(capsys, "train", kind, config, "--quiet")
        assert code == 2, err
        one_error_line(err, fragment)
        assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_on_a_cpu_only_torch_is_refused_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], trainer: tuple[str, Path]
) -> None:
    kind, config = trainer
    run_dir = config.parent / "run"
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet", "--train.device", "cuda")
    assert code == 2
    one_error_line(err, "train.device cuda: this torch", "sees no CUDA device; use cpu or auto")
    assert not run_dir.exists()
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet")  # the same run, on the CPU
    assert code == 0, err
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    code, _, err = run_cli(
        capsys, "train", kind, "--resume", run_dir, "--train.steps", "3", "--train.device", "cuda"
    )
    assert code == 2
    one_error_line(err, "sees no CUDA device")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # the run is untouched


def broken_template_model(tiny_model_dir: Path, where: Path) -> Path:
    """The tiny model with a chat template that refuses every conversation."""
    shutil.copytree(tiny_model_dir, where)
    (where / "chat_template.jinja").write_text("{{ raise_exception('no chats here') }}")
    tokenizer_config = json.loads((where / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (where / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return where


@pytest.mark.parametrize(
    ("kind", "bad", "fixed", "fragment"),
    [  # each refusal, then the same command with the value fixed
        ("sft", ["--data.max_length", "8"], ["--data.max_length", "256"], "shorter than the prompt of row 0"),
        ("sft", ["--lora.target_modules", '["qkv"]'], ["--lora.target_modules", '["q_proj"]'], "qkv not in"),
        (
            "sft",
            ["--train.threads", "100000"],
            ["--train.threads", "1"],
            "train.threads 100000: this process",
        ),
        ("sft", ["--model.path", "TEMPLATE", "--model.tiny", "none"], [], "row 0: the model's chat template"),
        ("rl", ["--lora.target_modules", '["qkv"]'], ["--lora.target_modules", '["q_proj"]'], "qkv not in"),
        ("rl", ["--model.path", "TEMPLATE"], [], "the model's chat template cannot render"),
        ("rl", ["--env.args", "{num_examples = 0}"], [], "env.args:"),
        ("rl", ["--sampling.max_tokens", str(2**31)], [], "max_tokens must be an integer in [1, 2**31)"),
    ],
)
def test_no_refusal_leaves_anything_and_the_fixed_rerun_starts(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    games: Path,
    tiny_model_dir: Path,
    kind: str,
    bad: list[str],
    fixed: list[str],
    fragment: str,
) -> None:
    template = str(broken_template_model(tiny_model_dir, tmp_path / "template"))
    bad = [template if a == "TEMPLATE" else a for a in bad]
    config = (
        sft_toml(tmp_path, games)
        if kind == "sft"
        else rl_toml(tmp_path, f'[model]\npath = "{tiny_model_dir}"\n')
    )
    lora = ["--lora.enabled", "true"] if "--lora.target_modules" in bad else []
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # an empty folder stays empty; an absent one stays absent (the other tests)
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet", *lora, *bad)
    assert code == 2, err
    one_error_line(err, fragment)
    assert run_dir.is_dir() and nothing_in(run_dir)
    code, _, err = run_cli(capsys, "train", kind, config, "--quiet", *lora, *fixed)
    assert code == 0, err
    assert (run_dir / "final").is_dir()


def test_a_failure_among_the_first_writes_takes_them_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, games: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the checks the first writes begin (a tiny model's base, the config); if what follows them
    fails, a new run's folder is left as it was found."""
    from palaestra.train import sft

    def no_optimizer(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError("optim: refused late")

    monkeypatch.setattr(sft, "optimizer_and_schedule", no_optimizer)
    config = sft_toml(tmp_path, games)
    code, _, err = run_cli(capsys, "train", "sft", config, "--quiet")
    assert code == 2
    one_error_line(err, "optim: refused late")
    assert not (tmp_path / "run").exists()  # the base-model folder written before it is gone too

"""``palaestra train``: ``sft`` and ``rl`` (from a TOML config), ``curves`` (plot runs) and
``diagnose`` (why an RL run does or does not learn).

``palaestra train sft CONFIG.toml [--section.key VALUE ...]`` or ``palaestra train sft --resume
RUN_DIR [--section.key VALUE ...]``. A bad config, bad data or an impossible setting is one line
and exit status 2, found before anything is written; a run that diverges (NaN loss) or cannot
write (a full disk) is one line and exit status 1, keeping its checkpoints.

``--nproc N`` trains data-parallel on N processes of this machine (``palaestra.train.distributed``):
the config is read and what needs no model is checked here first, then torchrun's launcher starts
the N ranks. Under torchrun, only rank 0 prints the errors.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

from palaestra.cli.common import OneLineParser, UsageError

SFT_EPILOG = """\
Every key of the config can be overridden: --optim.lr 1e-4, --train.steps=40, --lora.enabled true,
--model.path smollm2 (values are TOML: strings may go unquoted). See docs/training.md.
"""


RL_EPILOG = """\
Every key of the config can be overridden: --loss.name dapo, --train.batch_size 64,
--sampling.temperature 1.25, --env.args '{opponent = "random"}'. See docs/training.md.
"""


class OverridesParser(OneLineParser):
    """An argparse parser that also takes ``--section.key VALUE`` pairs, kept in ``args.overrides``."""

    def parse_known_args(  # type: ignore[override]  # same signature; typeshed's overloads differ per version
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        tokens = list(sys.argv[1:] if args is None else args)
        rest, overrides = [], []
        while tokens:
            token = tokens.pop(0)
            if token.startswith("--") and "." in token.partition("=")[0]:
                overrides.append(token)
                if "=" not in token and tokens:
                    overrides.append(tokens.pop(0))
            else:
                rest.append(token)
        parsed, unknown = super().parse_known_args(rest, namespace)
        parsed.overrides = overrides
        return parsed, unknown


def add_train_parser(subparsers: Any) -> None:
    """Register ``palaestra train`` and its subcommands on the CLI's subparsers."""
    train = subparsers.add_parser(
        "train", help="train a model: sft, rl; curves and diagnosis of training runs"
    )
    commands = train.add_subparsers(required=True, metavar="COMMAND", parser_class=OverridesParser)

    for kind, help_text, epilog, pattern in (
        (
            "sft",
            "supervised fine-tuning on the assistant turns of saved rollouts or chats",
            SFT_EPILOG,
            "*.toml",
        ),
        (
            "rl",
            "reinforcement learning on an environment's rewards (GRPO family, CISPO)",
            RL_EPILOG,
            "*rl*.toml",
        ),
    ):
        command = commands.add_parser(
            kind,
            help=help_text,
            usage=f"palaestra train {kind} [-h] [CONFIG | --resume RUN_DIR] [--quiet] [--nproc N] "
            "[--section.key VALUE ...]",
            epilog=epilog,
        )
        command.add_argument(
            "config", nargs="?", type=Path, help=f"a TOML config (see examples/tictactoe/{pattern})"
        )
        command.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR", help="continue a run")
        command.add_argument(
            "--quiet", action="store_true", help="plain progress lines instead of a progress bar"
        )
        command.add_argument(
            "--nproc",
            type=int,
            default=None,
            metavar="N",
            help="train data-parallel on N processes of this machine (torchrun; gloo on CPU, NCCL on GPUs)",
        )
        command.set_defaults(func=functools.partial(_train, kind=kind))

    curves = commands.add_parser("curves", help="write the loss curves of training runs as one HTML page")
    curves.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    curves.add_argument("-o", "--output", type=Path, default=None, help="default: RUN_DIR/curves.html")
    curves.set_defaults(func=cmd_curves)

    diagnose = commands.add_parser(
        "diagnose",
        help="why an RL run does or does not learn: its signal, replies and policy, and the likely causes",
    )
    diagnose.add_argument("run", type=Path, metavar="RUN_DIR")
    diagnose.set_defaults(func=cmd_diagnose)


def _train(args: argparse.Namespace, kind: str) -> int:
    """``palaestra train sft`` and ``palaestra train rl``: the config (or the resumed run's), then the run."""
    if os.environ.get("RANK", "0") == "0":
        return _run(args, kind)
    try:  # another rank of torchrun's: rank 0 reports the same error (or interruption), once
        return _run(args, kind)
    except UsageError:
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace, kind: str) -> int:
    import importlib

    from palaestra.train.config import load_config, parse_overrides

    if args.resume is not None and args.config is not None:
        raise UsageError("give a CONFIG or --resume RUN_DIR, not both (a resumed run keeps its config)")
    if args.resume is None and args.config is None:
        raise UsageError("give a CONFIG file (or --resume RUN_DIR)")
    _check_train_extra()
    from palaestra.train.common import TrainingError

    trainer = importlib.import_module(f"palaestra.train.{kind}")  # sft.py or rl.py
    try:
        overrides = parse_overrides(args.overrides)
        if args.resume is not None:
            config = trainer.resume_config(args.resume, overrides)
        else:
            config_module = importlib.import_module(f"palaestra.train.{kind}_config")
            config = load_config(getattr(config_module, f"{kind.upper()}Config"), args.config, overrides)
    except (ValueError, OSError) as exc:
        raise UsageError(one_line(exc)) from None
    if args.nproc is not None and "WORLD_SIZE" not in os.environ:
        return _launch(args, kind, config)
    try:
        getattr(trainer, f"train_{kind}")(config, resume=args.resume, progress=None if args.quiet else True)
    except TrainingError as exc:
        if os.environ.get("RANK", "0") == "0":
            print(f"palaestra: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:  # a refusal (ConfigError is one), found before anything is written
        raise UsageError(one_line(exc)) from None
    except KeyboardInterrupt:
        run_dir = args.resume or Path(config.output.dir)
        raise KeyboardInterrupt(
            f"interrupted; continue from the last checkpoint with: palaestra train {kind} --resume {run_dir}"
        ) from None
    return 0


def _launch(args: argparse.Namespace, kind: str, config: Any) -> int:
    """``--nproc N``: check what needs no model (the batch shares, the run folder), then start N ranks."""
    from palaestra.train.common import start_from
    from palaestra.train.distributed import World, check_shares, launch

    if args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    world = World(size=args.nproc)
    try:
        check_shares(config.train, world)
        start_from(args.resume or Path(config.output.dir), args.resume is not None, config.train.steps)
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None
    argv = ["train", kind, *([str(args.config)] if args.config else ["--resume", str(args.resume)])]
    argv += [*(["--quiet"] if args.quiet else []), *args.overrides]
    return launch(args.nproc, argv)


def one_line(exc: BaseException, limit: int = 2000) -> str:
    """An error as one line: libraries' messages (transformers', torch's) often span several."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _check_train_extra() -> None:
    """The train extra's packages, checked before any work."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"training needs the train extra: pip install 'palaestra[train]' ({exc})") from None


def cmd_diagnose(args: argparse.Namespace) -> int:
    from palaestra.train.diagnose import report

    try:
        print(report(args.run))
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_curves(args: argparse.Namespace) -> int:
    from palaestra.train.curves import write_curves

    out = args.output or args.runs[0] / "curves.html"
    print(f"curves: {write_curves(args.runs, out)}")
    return 0

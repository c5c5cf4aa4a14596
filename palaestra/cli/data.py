"""``palaestra data filter``: saved runs → the rollouts worth learning from → an SFT dataset."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from palaestra.cli.common import UsageError
from palaestra.data.filter import Condition, filter_rollouts
from palaestra.data.rollouts import reply_weights, rollouts_to_rows, save_dataset
from palaestra.eval.store import load_run
from palaestra.types import Rollout

PROVENANCE = "palaestra_filter.json"


def add_data_parser(sub: Any) -> None:
    data = sub.add_parser("data", help="turn saved runs into training data")
    commands = data.add_subparsers(required=True, metavar="COMMAND")
    keep = commands.add_parser(
        "filter",
        help="keep the rollouts that pass conditions; write them as a chat dataset for SFT",
        description="Keep the rollouts of saved runs that pass every --where condition and write them "
        "as the Hugging Face dataset --save-dataset writes (datasets.load_from_disk).",
    )
    keep.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    keep.add_argument("-o", "--output", type=Path, required=True, help="dataset folder to create")
    keep.add_argument(
        "-w",
        "--where",
        action="append",
        default=[],
        metavar="CONDITION",
        help="e.g. 'won == 1 or drew == 1', 'reward >= 0.5', 'format_reward == 1' (repeatable: all must hold)",
    )
    keep.add_argument("--keep-errors", action="store_true", help="keep rollouts that failed")
    keep.add_argument(
        "--keep-truncated", action="store_true", help="keep rollouts whose last reply hit max_tokens"
    )
    keep.add_argument(
        "--drop-flagged",
        action="store_true",
        help="also drop rollouts with a reply not to imitate (cut at max_tokens, empty/missing <think>, a refusal)",
    )
    keep.add_argument(
        "--mask-rejected",
        default=None,
        metavar="REGEX",
        help="keep a reply whose next message (the environment's answer) matches REGEX in the conversation "
        "but give it weight 0, so SFT does not train on it; e.g. '^Invalid move' keeps a teacher's "
        "recoveries from its deliberate mistakes without teaching the mistakes",
    )
    keep.add_argument(
        "--jsonl", type=Path, default=None, metavar="PATH", help="also write the rows as JSON lines"
    )
    keep.set_defaults(func=cmd_filter)


def cmd_filter(args: argparse.Namespace) -> int:
    _check_outputs(args.output, args.jsonl)
    conditions = [Condition.parse(text) for text in args.where]
    try:
        rejected = re.compile(args.mask_rejected) if args.mask_rejected is not None else None
    except re.error as exc:
        raise UsageError(
            f"--mask-rejected {args.mask_rejected!r} is not a regular expression: {exc}"
        ) from None
    rollouts: list[Rollout] = []
    for run_dir in args.runs:
        run = load_run(run_dir)
        if run.skipped:
            print(f"{run_dir}: skipped {len(run.skipped)} unreadable lines", file=sys.stderr)
        rollouts.extend(run.rollouts)
    report = filter_rollouts(
        rollouts,
        conditions,
        keep_errors=args.keep_errors,
        keep_truncated=args.keep_truncated,
        drop_flagged=args.drop_flagged,
    )
    print(f"kept {len(report.kept)} of {report.total} rollouts")
    if rejected is not None:
        masked = sum(reply_weights(r.messages, rejected).count(0) for r in report.kept)
        print(f"  {masked} replies answered with /{rejected.pattern}/ kept with weight 0 (not trained)")
    for reason, count in report.dropped.most_common():
        print(f"  dropped {count}: {reason}")
    for kind, count in report.warnings.most_common():
        print(
            f"  warning: {count} kept replies with {kind}"
            + ("" if args.drop_flagged else " (--drop-flagged drops them)")
        )
    if not report.kept:
        raise UsageError("no rollout passed: nothing written")
    try:
        save_dataset(report.kept, args.output, rejected)
        provenance = {
            "runs": [str(p) for p in args.runs],
            "where": [c.text for c in conditions],
            "keep_errors": args.keep_errors,
            "keep_truncated": args.keep_truncated,
            "drop_flagged": args.drop_flagged,
            "mask_rejected": args.mask_rejected,
            "total": report.total,
            "kept": len(report.kept),
            "dropped": dict(report.dropped),
            "warnings": dict(report.warnings),
        }
        (args.output / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        if args.jsonl is not None:
            with args.jsonl.open("w") as f:
                for rollout, row in zip(report.kept, rollouts_to_rows(report.kept, rejected), strict=True):
                    # the chat messages as sent, with weight 0 on the masked replies
                    weights = reply_weights(rollout.messages, rejected)
                    messages = [
                        m if w else {**m, "weight": 0} for m, w in zip(rollout.messages, weights, strict=True)
                    ]
                    cut = len(rollout.prompt)
                    row.update(prompt=messages[:cut], completion=messages[cut:])
                    f.write(json.dumps(row, default=repr) + "\n")
    except BaseException:
        shutil.rmtree(args.output, ignore_errors=True)  # nothing half-written
        if args.jsonl is not None:
            args.jsonl.unlink(missing_ok=True)
        raise
    print(f"dataset: {args.output}" + (f"; jsonl: {args.jsonl}" if args.jsonl else ""))
    return 0


def _check_outputs(output: Path, jsonl: Path | None) -> None:
    """Refuse, before reading any run, outputs that exist or could not be written where they are."""
    for flag, path in (("-o", output), ("--jsonl", jsonl)):
        if path is None:
            continue
        if path.exists() or path.is_symlink():
            raise UsageError(f"{flag} {path} exists; give a new path (nothing is overwritten)")
        parent = next((p for p in path.absolute().parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise UsageError(f"{flag} {path}: {parent} is a file, not a folder")
    if jsonl is not None and jsonl.absolute() == output.absolute():
        raise UsageError(f"-o and --jsonl are the same path ({output}); the dataset is a folder")
    if (
        jsonl is not None
        and not jsonl.absolute().parent.is_dir()
        and output.absolute() not in jsonl.absolute().parents
    ):
        raise UsageError(f"--jsonl {jsonl}: no folder {jsonl.parent}")

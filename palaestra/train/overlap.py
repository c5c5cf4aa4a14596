"""Whether an evaluation asks a model what it was fine-tuned on.

Teacher data and evaluation sets often come from the same environment, differing only in their
seed, and can share prompts without anyone noticing. The SFT trainer writes the prompts it
trains on (``RUN_DIR/train_prompts.json``: a sha256 per distinct prompt, the messages before the
first assistant reply); ``palaestra eval -m CHECKPOINT`` reads them back for a model trained here
and warns when examples it is about to run were among them. A prompt that opens several of the
environment's examples (a game's opening message) identifies none of them and is not counted.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from palaestra.types import Messages, content_text

PROMPTS_FILE = "train_prompts.json"


def prompt_key(messages: Messages) -> str:
    """The sha256 of a prompt: the roles and texts of the messages before the first assistant one."""
    prompt = []
    for message in messages:
        if message.get("role") == "assistant":
            break
        prompt.append([str(message.get("role")), content_text(message.get("content")).strip()])
    return hashlib.sha256(json.dumps(prompt, ensure_ascii=False).encode()).hexdigest()


def write_train_prompts(run_dir: Path, conversations: Iterable[Messages], source: str) -> Path:
    """Write the keys of the prompts an SFT run trains on into ``run_dir``."""
    keys = sorted({prompt_key(c) for c in conversations})
    path = run_dir / PROMPTS_FILE
    path.write_text(json.dumps({"data": source, "prompts": keys}) + "\n")
    return path


def train_prompts_for(model: str | Path) -> tuple[Path, set[str]] | None:
    """The SFT run a model folder came from (its checkpoint, ``final``, or the run folder) and the
    keys of its training prompts; None for a model not trained here, or a file that cannot be read."""
    path = Path(model).expanduser()
    try:
        path = path.resolve()
    except OSError:
        return None
    for run_dir in (path, path.parent.parent if path.parent.name == "checkpoints" else None):
        if run_dir is None:
            continue
        try:
            data = json.loads((run_dir / PROMPTS_FILE).read_text())
            return run_dir, {str(k) for k in data["prompts"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def overlapping(prompts: Sequence[Messages], trained: set[str], dataset: Sequence[Messages] = ()) -> int:
    """How many of ``prompts`` are among the ``trained`` prompt keys.

    ``dataset``: the prompts of all the environment's examples. A prompt that opens more than one
    of them (a game's "New game, you move first") does not tell its example apart: an interactive
    environment's examples differ after it (the opponent's seed, its moves), so sharing it with
    the training data is not evaluating on the training data, and it is not counted."""
    keys = [prompt_key(p) for p in prompts]
    opened = Counter(prompt_key(p) for p in dataset) if dataset else Counter(keys)
    return sum(key in trained and opened[key] <= 1 for key in keys)

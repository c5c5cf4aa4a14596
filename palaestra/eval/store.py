"""A saved evaluation run on disk: ``results.jsonl`` (one rollout per line) and ``metadata.json``.

Rollouts are appended group by group with one ``write`` and a flush, so a killed process loses
at most the groups in flight; a line cut short by a kill is skipped when the run is read back.
``metadata.json`` is replaced atomically (write to a temporary file, then rename).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from palaestra.types import Rollout

RESULTS = "results.jsonl"
METADATA = "metadata.json"


class RunStoreError(ValueError):
    """A run directory is missing, incomplete or unreadable."""


def run_dir_name(env_id: str, model: str) -> str:
    """``<env>--<model>`` with anything but letters, digits, ``._-`` replaced (``/`` in model ids)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{env_id}--{model}")


def new_run_id() -> str:
    """A sortable, unique id: UTC time plus 6 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.results_path = self.path / RESULTS
        self.metadata_path = self.path / METADATA

    @classmethod
    def create(cls, root: Path, env_id: str, model: str) -> RunStore:
        """A new, empty run directory under ``root/evals/<env>--<model>/<run-id>/``."""
        path = Path(root) / "evals" / run_dir_name(env_id, model) / new_run_id()
        path.mkdir(parents=True, exist_ok=False)
        store = cls(path)
        store.results_path.touch()
        return store

    @classmethod
    def open(cls, path: Path) -> RunStore:
        """An existing run directory; ``RunStoreError`` if it is not one."""
        store = cls(Path(path))
        if not store.path.is_dir():
            raise RunStoreError(f"{path}: no such run directory")
        for needed in (store.metadata_path, store.results_path):
            if not needed.is_file():
                raise RunStoreError(f"{path}: not a run directory (no {needed.name})")
        return store

    def append(self, rollouts: Sequence[Rollout]) -> None:
        """Append rollouts, one JSON line each, in one write, flushed to the OS."""
        data = b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in rollouts)
        with self.results_path.open("ab") as f:
            f.write(data)
            f.flush()

    def rewrite(self, rollouts: Sequence[Rollout]) -> None:
        """Replace the results with exactly ``rollouts`` (used by resume to drop partial groups)."""
        tmp = self.results_path.with_suffix(".jsonl.tmp")
        tmp.write_bytes(b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in rollouts))
        os.replace(tmp, self.results_path)

    def load_rollouts(self) -> tuple[list[Rollout], int]:
        """The saved rollouts and the number of unreadable lines skipped (a kill mid-write)."""
        rollouts, skipped = [], 0
        with self.results_path.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rollouts.append(Rollout.from_dict(orjson.loads(line)))
                except (orjson.JSONDecodeError, TypeError, KeyError):
                    skipped += 1
        return rollouts, skipped

    def read_metadata(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self.metadata_path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise RunStoreError(f"{self.metadata_path}: unreadable ({exc})") from None
        if not isinstance(data, dict):
            raise RunStoreError(f"{self.metadata_path}: not a JSON object")
        return data

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        tmp = self.metadata_path.with_suffix(".json.tmp")
        tmp.write_bytes(orjson.dumps(metadata, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.metadata_path)

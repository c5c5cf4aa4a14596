"""A saved evaluation run on disk: ``results.jsonl`` (one rollout per line) and ``metadata.json``.

Rollouts are appended group by group with one ``write`` and a flush, so a killed process loses
at most the groups in flight; a line cut short by a kill is skipped when the run is read back.
``metadata.json`` is replaced atomically (write to a temporary file, then rename). It holds a
``RunMetadata``: the run spec's fields sit at the top level of the JSON object, as they always
have, so runs saved by any version of palaestra read back the same way.

``load_run`` is the one reader of a saved run: resume, ``palaestra report`` and the data tools
all go through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

try:
    import fcntl
except ImportError:  # Windows: runs are not locked there
    fcntl = None  # type: ignore[assignment]  # checked before use

from palaestra.types import Rollout, RunSpec

RESULTS = "results.jsonl"
METADATA = "metadata.json"
LOCK = "run.lock"
STATUSES = ("running", "complete", "interrupted")


class RunStoreError(ValueError):
    """A run directory is missing, incomplete or unreadable."""


@dataclass
class RunMetadata:
    """What a saved run is: the environment, the model, the spec, its progress and its summary."""

    env_id: str
    model: str
    spec: RunSpec
    env_args: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    base_url: str | None = None
    api_key_var: str | None = None
    pass_threshold: float = 0.5
    # each reward function and metric: {"weight": float, "higher_is_better": bool}, for the report
    rubric: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    status: str = "running"
    counts: dict[str, int] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # Environment.run_notes(): a weaker sandbox, say

    def to_dict(self) -> dict[str, Any]:
        """The JSON object saved as ``metadata.json`` (the spec's fields at the top level)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "spec"}
        if not out["notes"]:  # written only when there is something to say (a weaker sandbox)
            del out["notes"]
        spec = self.spec.to_dict()
        # the historical key order: identity, then what was run, then progress
        ordered = {
            k: out.pop(k) for k in ("run_id", "env_id", "env_args", "model", "base_url", "api_key_var")
        }
        ordered["sampling"] = spec.pop("sampling")
        return {**ordered, **spec, **out}

    @classmethod
    def from_dict(cls, data: Any) -> RunMetadata:
        """Read ``to_dict``'s object back; ``ValueError`` naming the first field that is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data = dict(data)
        spec_keys = {f.name for f in dataclasses.fields(RunSpec)}
        spec_data = {k: data.pop(k) for k in list(data) if k in spec_keys}
        if spec_data.get("sampling") is None:
            spec_data.pop("sampling", None)
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}  # fields of later versions are ignored
        for key in ("env_args", "rubric", "versions", "counts", "summary", "notes"):
            if values.get(key) is None:
                values.pop(key, None)
            elif not isinstance(values[key], dict):
                raise ValueError(f"{key!r} is not an object")
        if "sampling" in spec_data and not isinstance(spec_data["sampling"], dict):
            raise ValueError("'sampling' is not an object")
        for key in ("run_id", "base_url", "api_key_var", "started_at", "finished_at"):
            if values.get(key) is not None and not isinstance(values[key], str):
                raise ValueError(f"{key!r} is not a string")
        for key in ("env_id", "model"):
            if not isinstance(values.get(key), str):
                raise ValueError(f"{key!r} is missing or not a string")
        try:
            spec = RunSpec.from_dict(spec_data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the run spec is invalid: {exc}") from None
        threshold = values.get("pass_threshold", 0.5)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError("'pass_threshold' is not a number")
        if values.get("status", "running") not in STATUSES:
            raise ValueError(f"'status' must be one of {', '.join(STATUSES)}")
        return cls(spec=spec, **values)


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
        if not store.path.exists():
            raise RunStoreError(f"{path}: no such directory")
        if not store.path.is_dir():
            raise RunStoreError(f"{path}: not a directory")
        for needed in (store.results_path, store.metadata_path):
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

    def load_rollouts(self) -> tuple[list[Rollout], list[int]]:
        """The saved rollouts and the 1-based numbers of the lines that could not be read (a line
        torn by a kill mid-write, or one that is not a rollout)."""
        rollouts, skipped = [], []
        with self.results_path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rollouts.append(Rollout.from_dict(orjson.loads(line)))
                except (ValueError, TypeError, KeyError, AttributeError):
                    skipped.append(number)
        return rollouts, skipped

    def read_metadata(self) -> RunMetadata:
        try:
            data = orjson.loads(self.metadata_path.read_bytes())
        except OSError as exc:
            raise RunStoreError(f"{self.metadata_path}: unreadable ({exc})") from None
        except orjson.JSONDecodeError as exc:
            raise RunStoreError(f"{self.metadata_path}: malformed JSON ({exc})") from None
        try:
            return RunMetadata.from_dict(data)
        except ValueError as exc:
            raise RunStoreError(f"{self.metadata_path}: malformed ({exc})") from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[str | None]:
        """Hold the run for this process while the block runs; ``RunStoreError`` if another holds it.

        The lock is an OS file lock on ``run.lock``, which also records the holder's pid: a lock
        file left by a process that died holds no OS lock, so it is taken over, and the block gets
        a line naming that stale holder (else ``None``). The file is removed when the block ends,
        so a finished run leaves none. POSIX only: on Windows it locks nothing.
        """
        if fcntl is None:
            yield None
            return
        path = self.path / LOCK
        fd = self._locked(path)
        try:
            previous = os.pread(fd, 200, 0).decode(errors="replace").strip()
            stale = f"took over a stale lock of {previous}, which is gone" if previous else None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"process {os.getpid()}".encode(), 0)
            try:
                yield stale
            finally:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # while still locked: whoever opens it next makes a new file
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _locked(self, path: Path) -> int:
        """An open descriptor of ``path``, OS-locked by this process; ``RunStoreError`` if another has it."""
        assert fcntl is not None
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise RunStoreError(
                    f"{self.path} is in use by {holder}; wait for it to finish or stop it"
                ) from None
            try:
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed the file as we opened it: lock the one there now

    def write_metadata(self, metadata: RunMetadata) -> None:
        tmp = self.metadata_path.with_suffix(".json.tmp")
        tmp.write_bytes(orjson.dumps(metadata.to_dict(), option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.metadata_path)


@dataclass
class EvalRun:
    """A finished (or interrupted) evaluation: where it is saved, its metadata and its rollouts.

    ``skipped`` holds the 1-based numbers of the results lines that could not be read.
    """

    path: Path | None
    metadata: RunMetadata
    rollouts: list[Rollout] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        """The saved summary; for a run that never wrote one (killed), or whose saved summary is not
        what ``summarize`` writes (a damaged file), computed from its rollouts."""
        from palaestra.eval.summary import summarize, summary_problem

        if not self.metadata.summary or summary_problem(self.metadata.summary) is not None:
            self.metadata.summary = summarize(
                self.rollouts,
                rollouts_per_example=self.metadata.spec.rollouts_per_example,
                pass_threshold=self.metadata.pass_threshold,
            )
        return self.metadata.summary


def load_run(path: Path | str) -> EvalRun:
    """Read a saved run: its metadata and every readable rollout, in (example, index) order.

    ``RunStoreError`` (one line) if ``path`` is not a readable run directory.
    """
    store = RunStore.open(Path(path))
    metadata = store.read_metadata()
    rollouts, skipped = store.load_rollouts()
    rollouts.sort(key=lambda r: (r.example_id, r.rollout_index))
    return EvalRun(path=store.path, metadata=metadata, rollouts=rollouts, skipped=skipped)

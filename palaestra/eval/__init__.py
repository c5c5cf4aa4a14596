"""Evaluation: run an environment against a model, save the run, summarise and report it."""

from palaestra.eval.run import evaluate
from palaestra.eval.store import EvalRun, RunMetadata, RunStore, RunStoreError, load_run

__all__ = ["EvalRun", "RunMetadata", "RunStore", "RunStoreError", "evaluate", "load_run"]

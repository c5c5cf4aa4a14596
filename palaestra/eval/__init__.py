"""Evaluation: run an environment against a model, save the run, summarise and report it."""

from palaestra.eval.run import EvalRun, evaluate, load_run
from palaestra.eval.store import RunStore, RunStoreError

__all__ = ["EvalRun", "RunStore", "RunStoreError", "evaluate", "load_run"]

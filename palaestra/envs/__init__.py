"""Environment types: single-turn and multi-turn."""

from palaestra.envs.base import DatasetError, Environment, RolloutTimeout
from palaestra.envs.multiturn import Final, MultiTurnEnv, stop
from palaestra.envs.singleturn import SingleTurnEnv

__all__ = ["DatasetError", "Environment", "Final", "MultiTurnEnv", "RolloutTimeout", "SingleTurnEnv", "stop"]

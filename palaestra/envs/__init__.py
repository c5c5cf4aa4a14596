"""Environment types: single-turn, multi-turn, and tool-using."""

from palaestra.envs.base import DatasetError, Environment, RolloutTimeout
from palaestra.envs.multiturn import EpisodeError, Final, MultiTurnEnv, stop
from palaestra.envs.singleturn import SingleTurnEnv
from palaestra.envs.tool import StatefulToolEnv, ToolEnv

__all__ = [
    "DatasetError", "Environment", "EpisodeError", "Final", "MultiTurnEnv", "RolloutTimeout", "SingleTurnEnv",
    "StatefulToolEnv", "ToolEnv", "stop",
]  # fmt: skip

"""Environment types: single-turn, multi-turn, tool-using, and mixtures of them."""

from palaestra.envs.base import DatasetError, Environment, RolloutTimeout
from palaestra.envs.group import EnvGroup
from palaestra.envs.multiturn import EpisodeError, Final, MultiTurnEnv, stop
from palaestra.envs.repl import ReplEnv
from palaestra.envs.rlm import RLMEnv
from palaestra.envs.singleturn import SingleTurnEnv
from palaestra.envs.tool import StatefulToolEnv, ToolEnv

__all__ = [
    "DatasetError",
    "EnvGroup",
    "Environment",
    "EpisodeError",
    "Final",
    "MultiTurnEnv",
    "RLMEnv",
    "ReplEnv",
    "RolloutTimeout",
    "SingleTurnEnv",
    "StatefulToolEnv",
    "ToolEnv",
    "stop",
]

"""``palaestra ARGV`` on a rank that torchrun starts, with the toy environment of ``toy_rl_env.py``
as the RL trainer's ``toy`` (``python -m torch.distributed.run ... THIS train rl CONFIG``)."""

from __future__ import annotations

import os
import sys

from toy_rl_env import load

from palaestra.cli import main
from palaestra.train import rl_rollouts

if __name__ == "__main__":
    rl_rollouts.load_environment = load  # type: ignore[assignment]
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as palaestra's ranks end (its __main__): gloo's threads can abort the teardown

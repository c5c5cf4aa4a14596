"""``palaestra ARGV`` on a rank that torchrun starts, with the toy environment of ``toy_rl_env.py``
as the RL trainer's ``toy`` (``python -m torch.distributed.run ... THIS train rl CONFIG``). With
``TOY_RAY_ADDRESS`` set, rank 0 joins that Ray cluster first, with a runtime environment whose
workers load the toy environment by name too (``toy_rl_env.install``), and a rank that rolls out a
training group in its own process instead of on the workers fails."""

from __future__ import annotations

import os
import sys
from typing import Any

from toy_rl_env import load

from palaestra.cli import main
from palaestra.train import rl_rollouts

if __name__ == "__main__":
    rl_rollouts.load_environment = load  # type: ignore[assignment]
    if os.environ.get("TOY_RAY_ADDRESS"):
        in_process = rl_rollouts.stream_groups

        def on_ray_only(env: Any, client: Any, examples: Any, spec: Any) -> Any:
            if examples:
                raise AssertionError(f"rank {os.environ['RANK']} rolled out {len(examples)} groups itself")
            return in_process(env, client, examples, spec)

        rl_rollouts.stream_groups = on_ray_only  # type: ignore[assignment]
    if os.environ.get("TOY_RAY_ADDRESS") and os.environ.get("RANK") == "0":
        import ray

        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        ray.init(
            address=os.environ["TOY_RAY_ADDRESS"],
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}, "worker_process_setup_hook": "toy_rl_env.install"},
        )
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as palaestra's ranks end (its __main__): gloo's threads can abort the teardown

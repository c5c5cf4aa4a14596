"""Palaestra environments in other trainers and processes.

- ``server``: an environment behind HTTP (``palaestra env serve``), OpenEnv's reset/step/state;
- ``remote``: ``RemoteEnvironment``, an environment that lives behind such a server;
- ``tinker``: the environment as Tinker cookbook-style ``initial_observation``/``step`` envs
  and group builders;
- ``trl``: a rollout function and a reward function for TRL's ``GRPOTrainer``.

docs/interop.md has the wire format and what each gives and loses.
"""

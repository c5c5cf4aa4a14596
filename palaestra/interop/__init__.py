"""Palaestra environments in other trainers and processes.

- ``server``: an environment behind HTTP (``palaestra env serve``), OpenEnv's reset/step/state;
- ``remote``: ``RemoteEnvironment``, an environment that lives behind such a server;
- ``tinker``: the environment as Tinker cookbook-style ``initial_observation``/``step`` envs
  and group builders.

docs/interop.md has the wire format and what each gives and loses.
"""

"""The RL trainer's samplers: implementations of ``base.Sampler``, what the trainer needs of one.

- ``local.py``: ``LocalSampler``, the trained module sampled in this process (nothing copied).
- ``remote.py``: ``RemoteSampler``, a server that speaks vLLM's OpenAI API (vLLM itself, or
  ``palaestra serve``), reached over HTTP like ``palaestra eval`` reaches any endpoint.
- ``server.py``: a sampler server palaestra starts, waits for and stops itself.
- ``sync.py``: how new weights reach a remote sampler: a LoRA adapter per version, or a reload of
  the weights from disk.
- ``failures.py``: a sampler that fails mid-run stops the run before it trains on a partial batch.
"""

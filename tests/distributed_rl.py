"""RL on several ranks, for ``test_train_distributed.py``: one policy update per loss on a fixed
batch of token sequences (in one process, or on this rank's share), then a short RL run.

``python -m torch.distributed.run --nproc-per-node 2 THIS MODEL OUT RL_CONFIG`` does both in one
launch (a launch costs seconds): rank 0 saves each case's weights and figures in ``OUT``, then
every rank trains the run ``RL_CONFIG`` describes (``-``: none). The test runs the same cases in its own
process and compares. With ``fsdp`` (or ``layers``) after RL_CONFIG, the cases of ``FSDP_CASES``
run with the model sharded (``palaestra.train.fsdp``; ``layers``: its layer-by-layer mode) instead.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch

from palaestra.train.distributed import World, join, leave, world_from_env
from palaestra.train.losses import LOSSES, LossConfig
from palaestra.train.model import backbone_and_head
from palaestra.train.policy_update import policy_update
from palaestra.train.rollout_tokens import TokenSequence

# (case name, loss, kl_beta, how many rollouts of the batch): every loss, the KL term, and a batch
# of one rollout, which leaves the second rank nothing to train (it still takes part in the sums)
CASES = [(name, name, 0.0, 7) for name in LOSSES] + [
    ("cispo+kl", "cispo", 0.1, 7),
    ("one-rollout", "dapo", 0.0, 1),
]


def sequences(vocab: int, rollouts: int, seed: int = 0) -> list[TokenSequence]:
    """Rollouts of unequal lengths; rollout 2 is two rows (turns that do not chain)."""
    rng = random.Random(seed)
    out = []
    for r in range(rollouts):
        for _ in range(2 if r == 2 else 1):
            prompt, sampled = rng.randint(3, 12), rng.randint(2, 20)
            ids = [rng.randrange(vocab) for _ in range(prompt + sampled)]
            mask = [False] * prompt + [True] * sampled
            logprobs = [-5.8 + rng.gauss(0, 0.3) if m else 0.0 for m in mask]  # near a random model's
            out.append(
                TokenSequence(ids, mask, logprobs, advantage=rng.choice([-1.0, -0.5, 0.5, 1.0]), rollout=r)
            )
    return out


# the default loss, and a batch that leaves the second rank nothing to train, with the model sharded
FSDP_CASES = [("cispo", "cispo", 0.0, 7), ("one-rollout", "dapo", 0.0, 1)]


def run_case(
    model_dir: Path, case: tuple[str, str, float, int], world: World, sharded: bool | str = False
) -> tuple[dict[str, Any], Any]:
    """The weights after one update of two passes (several micro-batches each), and its figures;
    ``sharded``: with the model sharded over the ranks by FSDP (checked: every parameter a shard),
    ``"layers"`` in its layer-by-layer mode."""
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from palaestra.train.fsdp import shard

    _, loss, kl_beta, rollouts = case
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference = backbone_and_head(copy.deepcopy(model).eval().requires_grad_(False)) if kl_beta else None
    model.train()
    shards = shard(model, world, torch.device("cpu"), sharded)
    if sharded:
        assert shards is not None and all(isinstance(p, DTensor) for p in shards.params)
        assert shards.layers == (sharded == "layers")
    optimizer = torch.optim.AdamW(shards.params if shards else model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    backbone, head = backbone_and_head(model)
    batch = sequences(model.config.vocab_size, rollouts)
    stats = policy_update(
        model,
        head,
        backbone,
        optimizer,
        scheduler,
        world.deal(batch, key=lambda s: s.rollout),
        LossConfig(name=loss, kl_beta=kl_beta, max_tokens=20),
        passes=2,
        micro_batch_tokens=64,
        max_grad_norm=1.0,
        device=torch.device("cpu"),
        bf16=False,
        pad_id=0,
        reference=reference,
        world=world,
        shards=shards,
    )
    if shards is not None:  # AdamW's moments are shards too; the whole weights, gathered
        moments = [optimizer.state[p]["exp_avg"] for p in shards.params]
        assert all(isinstance(m, DTensor) and m.to_local().numel() < m.numel() for m in moments)
        return shards.full_state(optimizer)[0], stats
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, stats


def main() -> None:
    from palaestra.train.config import load_config
    from palaestra.train.rl import train_rl
    from palaestra.train.rl_config import RLConfig

    model_dir, out, rl_config = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    sharded: bool | str = {"fsdp": True, "layers": "layers"}.get("".join(sys.argv[4:]), False)
    torch.set_num_threads(1)
    world = world_from_env()
    join(world, torch.device("cpu"))
    try:
        for case in FSDP_CASES if sharded else CASES:
            weights, stats = run_case(model_dir, case, world, sharded)
            if world.main:
                torch.save(weights, out / f"{case[0]}.pt")
                (out / f"{case[0]}.json").write_text(json.dumps(dataclasses.asdict(stats)))
        if str(rl_config) != "-":  # "-": the cases only
            train_rl(load_config(RLConfig, rl_config), progress=False)  # in the process group joined here
    finally:
        leave(world)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as palaestra's ranks end (its __main__): gloo's threads can abort the teardown

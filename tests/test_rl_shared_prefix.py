"""RL's shared-prefix update (``train.share_prefix``): the start every sequence of a batch shares runs
once per pass, and the update is the one without it, to float rounding: loss, gradient norm,
mismatch figures and the weights after two passes, with the KL reference and a mismatch correction
on, over several micro-batches."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from palaestra.train import policy_update as pu  # noqa: E402 - after the torch skip
from palaestra.train.common import optimizer_and_schedule  # noqa: E402
from palaestra.train.config import ConfigError, load_config  # noqa: E402
from palaestra.train.losses import LossConfig  # noqa: E402
from palaestra.train.mismatch import MismatchConfig  # noqa: E402
from palaestra.train.model import backbone_and_head  # noqa: E402
from palaestra.train.rl_config import RLConfig  # noqa: E402
from palaestra.train.rollout_tokens import TokenSequence  # noqa: E402
from palaestra.train.sft_config import OptimConfig  # noqa: E402

PREFIX = 24  # tokens every sequence starts with, untrained (a system prompt)


def sequences(vocab: int, seed: int = 0) -> list[TokenSequence]:
    """Six sampled rollouts after a common prompt: varied lengths, two sampled spans in some."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3, vocab) for _ in range(PREFIX)]
    out = []
    for i in range(6):
        context = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))]
        reply = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 12))]
        more = [rng.randrange(3, vocab) for _ in range(rng.randint(0, 10))]  # the env's next message
        again = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 6))] if more else []
        ids = prompt + context + reply + more + again
        mask = (
            [False] * (PREFIX + len(context))
            + [True] * len(reply)
            + [False] * len(more)
            + [True] * len(again)
        )
        logprobs = [rng.uniform(-6, -0.5) if m else 0.0 for m in mask]
        out.append(TokenSequence(ids, mask, logprobs, rng.uniform(-1, 1), i))
    return out


def update(model: Any, reference: Any, share: bool) -> tuple[Any, dict]:
    """Two passes of SGD, whose step is the gradient itself (AdamW would magnify float rounding in
    near-zero gradients into visible differences)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    backbone, head = backbone_and_head(model)
    model.train()
    stats = pu.policy_update(
        model,
        head,
        backbone,
        optimizer,
        scheduler,
        sequences(model.config.vocab_size),
        LossConfig("cispo", kl_beta=0.05),
        passes=2,
        micro_batch_tokens=96,
        max_grad_norm=1.0,
        device=torch.device("cpu"),
        bf16=False,
        pad_id=0,
        temperature=0.9,
        reference=backbone_and_head(reference),
        mismatch=MismatchConfig(tis_cap=2.0),
        share_prefix=share,
    )
    return stats, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "sliding_model_dir"])
def test_the_shared_prefix_update_is_the_full_one(
    model_dir: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Also with sliding-window attention over 8 tokens, shorter than the 24-token prefix: the
    continuation's mask must still start the window inside the shared prefix's cache."""
    from transformers import AutoModelForCausalLM

    tiny_model_dir = request.getfixturevalue(model_dir)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = copy.deepcopy(base).eval()
    plain_stats, plain = update(copy.deepcopy(base), reference, share=False)

    runs = []
    real = pu.SharedPrefix

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(pu, "SharedPrefix", counted)
    stats, weights = update(base, reference, share=True)
    assert stats.shared_prefix >= PREFIX and plain_stats.shared_prefix == 0
    assert len(runs) == 4 and set(runs) == {stats.shared_prefix}  # policy and reference, each pass
    assert stats.loss == pytest.approx(plain_stats.loss, rel=1e-5, abs=1e-7)
    assert stats.grad_norm == pytest.approx(plain_stats.grad_norm, rel=1e-4) and stats.grad_norm > 0
    assert stats.kl == pytest.approx(plain_stats.kl, rel=1e-4, abs=1e-8)
    assert stats.mismatch == pytest.approx(plain_stats.mismatch, rel=1e-4, abs=1e-6)
    assert stats.entropy == pytest.approx(plain_stats.entropy, rel=1e-5)
    moved = [k for k in plain if not torch.equal(plain[k], reference.state_dict()[k])]
    assert moved  # the update did something to compare
    assert all(torch.allclose(weights[k], plain[k], atol=1e-6) for k in plain)  # gradients differ ~1e-7


def test_sequences_that_differ_from_the_start_share_nothing(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    seqs = sequences(model.config.vocab_size)
    seqs[3] = TokenSequence([7, *seqs[3].input_ids[1:]], seqs[3].mask, seqs[3].sampler_logprobs, 0.5, 3)
    optimizer, scheduler, _ = optimizer_and_schedule(model, OptimConfig(lr=1e-2), 1, None)
    backbone, head = backbone_and_head(model)
    stats = pu.policy_update(
        model,
        head,
        backbone,
        optimizer,
        scheduler,
        seqs,
        LossConfig("cispo"),
        passes=1,
        micro_batch_tokens=96,
        max_grad_norm=1.0,
        device=torch.device("cpu"),
        bf16=False,
        pad_id=0,
        share_prefix=True,
    )
    assert stats.shared_prefix == 0 and stats.grad_norm > 0


def test_rl_gradient_checkpointing_needs_prefix_sharing_off(tmp_path: Path) -> None:
    overrides = {"model.path": "m", "env.id": "tictactoe", "train.gradient_checkpointing": "true"}
    with pytest.raises(ConfigError, match="gradient_checkpointing needs share_prefix = false"):
        load_config(RLConfig, None, overrides)
    assert not load_config(RLConfig, None, {**overrides, "train.share_prefix": "false"}).train.share_prefix

"""Policy-gradient losses, each a small pure function of ``LossInputs``, picked by name from ``LOSSES``.

Every loss works on the tokens the sampler produced (``mask``), with ratios taken against the
*sampler's* logprobs: r = exp(logp − logp_sampler). So the importance correction acts even with a
single update pass, covering any mismatch between the sampler and the trainer (batch shapes,
kernels, stale weights). Advantages are per sequence.

How the per-token terms are averaged is the other half of each method, and it must be the same
over a whole batch however it is cut into micro-batches: ``token_weights`` gives every trained
token its weight from the whole batch's mask, and a loss returns −Σ weight × objective.

- ``grpo`` — clipped ratio min(r·A, clip(r, 1−ε, 1+ε)·A), mean over each rollout's tokens, then
  over rollouts (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).
- ``dr_grpo`` — the same clipped objective over a constant normaliser, rollouts × max tokens, so
  long and short replies weigh alike per token (Liu et al. 2025, arXiv:2503.20783); pair it with
  advantages not divided by the group's std.
- ``dapo`` — clip-higher (ε_low 0.2, ε_high 0.28) and a token-level mean over the batch
  (Yu et al. 2025, DAPO, arXiv:2503.14476).
- ``cispo`` — the importance weight clipped from above at 1+ε_high and detached, times the
  advantage, times the token's logprob; token-level mean. Unlike the clipped ratio, no token's
  gradient is ever zeroed (MiniMax 2025, MiniMax-M1, arXiv:2506.13585).
- ``masked_is`` — the ratio times the advantage, with tokens whose ratio falls outside
  [0.125, 8] masked out of the loss; token-level mean (the importance-ratio policy gradient used
  for the published tic-tac-toe results).

An optional KL penalty to a reference policy, β · KL (the k3 estimator, exp(q) − q − 1 with
q = logp_ref − logp; Schulman 2020), is added when ``ref_logprobs`` is given. A mismatch
correction (``palaestra/train/mismatch.py``: TIS, MIS), when given, multiplies each token's weight
in the policy term, not in the KL term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

Normalizer = Literal["sequence", "token", "constant"]


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch: ``logprobs`` (with grad), the sampler's, advantages, which tokens train."""

    logprobs: torch.Tensor  # [B, T] the policy's logprobs of the sampled tokens
    sampler_logprobs: torch.Tensor  # [B, T] what the sampler reported for them
    advantages: torch.Tensor  # [B] one per sequence
    mask: torch.Tensor  # [B, T] bool: tokens the model sampled
    weights: torch.Tensor  # [B, T] each token's share of the batch loss (``token_weights``)
    ref_logprobs: torch.Tensor | None = None  # [B, T] for the KL penalty
    correction: torch.Tensor | None = None  # [B, T] the mismatch correction (mismatch.py), policy term only


@dataclass
class LossOutputs:
    """The loss to backpropagate, and per-token metric *sums* (the trainer divides by tokens)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class LossConfig:
    """The knobs of the losses; each loss reads the ones it uses."""

    name: str = "cispo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    mask_low: float = 0.125  # masked_is: ratios outside [mask_low, mask_high] are masked
    mask_high: float = 8.0
    kl_beta: float = 0.0
    max_tokens: int = 256  # dr_grpo's constant normaliser: tokens per sequence


def token_weights(
    mask: torch.Tensor,
    normalizer: Normalizer,
    *,
    max_tokens: int = 1,
    rollouts: torch.Tensor | None = None,
    batch: BatchCounts | None = None,
) -> torch.Tensor:
    """Each trained token's weight in the batch loss, from the *whole batch's* ``mask`` [B, T].

    ``rollouts`` [B] says which rollout each row came from (a rollout whose turns do not chain is
    several rows); without it every row is a rollout of its own. A rollout weighs the same however
    many rows it was cut into:

    ``sequence``: 1 / (trained tokens of its rollout × rollouts); ``token``: 1 / tokens in the
    batch; ``constant``: 1 / (rollouts × ``max_tokens``).

    When ``mask`` is one rank's share of a batch split across processes, ``batch`` gives the whole
    batch's counts (``batch_counts`` of each share, summed): the weights are then the ones the
    whole batch would give these tokens, so the ranks' summed gradient is the one-process gradient.
    """
    m = mask.float()
    if rollouts is None:
        rollouts = torch.arange(mask.shape[0])
    total = batch or batch_counts(mask, rollouts)
    count = max(total.rollouts, 1)
    if normalizer == "sequence":
        per_row = m.sum(dim=1)
        per_rollout = torch.zeros(int(rollouts.max()) + 1 if rollouts.numel() else 1).index_add_(
            0, rollouts, per_row
        )
        return m / per_rollout[rollouts].clamp(min=1)[:, None] / count
    if normalizer == "token":
        return m / max(total.tokens, 1)
    if normalizer == "constant":
        return m / (count * max_tokens)
    raise ValueError(f"unknown normalizer {normalizer!r}")


@dataclass(frozen=True)
class BatchCounts:
    """What the normalisers count over a batch: its trained tokens, and the rollouts that have some."""

    tokens: int
    rollouts: int


def batch_counts(mask: torch.Tensor, rollouts: torch.Tensor | None = None) -> BatchCounts:
    """The trained tokens of ``mask`` [B, T] and the rollouts (``rollouts`` [B]; else rows) with any."""
    if rollouts is None:
        rollouts = torch.arange(mask.shape[0])
    trained = mask.any(dim=1)
    return BatchCounts(tokens=int(mask.sum()), rollouts=int(torch.unique(rollouts[trained]).numel()))


def _ratio(inputs: LossInputs) -> torch.Tensor:
    return torch.exp(inputs.logprobs - inputs.sampler_logprobs)


def _clipped_surrogate(inputs: LossInputs, eps_low: float, eps_high: float) -> LossOutputs:
    ratio = _ratio(inputs)
    adv = inputs.advantages[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    objective = torch.minimum(unclipped, clipped)
    loss = -(inputs.weights * objective).sum()
    mask = inputs.mask
    was_clipped = (clipped < unclipped) & mask  # where the clip took the gradient away
    return LossOutputs(loss, {"clipped": was_clipped.sum().float(), "ratio": (ratio * mask).sum().detach()})


def grpo(inputs: LossInputs, config: LossConfig) -> LossOutputs:
    """GRPO's clipped ratio objective (normalised per sequence by ``token_weights``)."""
    return _clipped_surrogate(inputs, config.eps_low, config.eps_low)


def dr_grpo(inputs: LossInputs, config: LossConfig) -> LossOutputs:
    """The clipped objective of GRPO; Dr. GRPO's difference is its constant normaliser."""
    return _clipped_surrogate(inputs, config.eps_low, config.eps_low)


def dapo(inputs: LossInputs, config: LossConfig) -> LossOutputs:
    """Clip-higher: a wider upper clip (ε_high) than lower (ε_low)."""
    return _clipped_surrogate(inputs, config.eps_low, config.eps_high)


def cispo(inputs: LossInputs, config: LossConfig) -> LossOutputs:
    """sg(min(r, 1+ε_high)) · A · logp: every token keeps its gradient, only its weight is capped."""
    ratio = _ratio(inputs)
    weight = ratio.clamp(max=1 + config.eps_high).detach()
    objective = weight * inputs.advantages[:, None] * inputs.logprobs
    loss = -(inputs.weights * objective).sum()
    capped = (ratio > 1 + config.eps_high) & inputs.mask
    return LossOutputs(loss, {"clipped": capped.sum().float(), "ratio": (ratio * inputs.mask).sum().detach()})


def masked_is(inputs: LossInputs, config: LossConfig) -> LossOutputs:
    """r · A, with tokens whose ratio to the sampler is outside [mask_low, mask_high] left out."""
    ratio = _ratio(inputs)
    keep = (ratio >= config.mask_low) & (ratio <= config.mask_high)
    objective = ratio * inputs.advantages[:, None] * keep
    loss = -(inputs.weights * objective).sum()
    masked = ~keep & inputs.mask
    return LossOutputs(loss, {"clipped": masked.sum().float(), "ratio": (ratio * inputs.mask).sum().detach()})


LossFn = Callable[[LossInputs, LossConfig], LossOutputs]
LOSSES: dict[str, tuple[LossFn, Normalizer]] = {
    "grpo": (grpo, "sequence"),
    "dr_grpo": (dr_grpo, "constant"),
    "dapo": (dapo, "token"),
    "cispo": (cispo, "token"),
    "masked_is": (masked_is, "token"),
}


def compute_loss(inputs: LossInputs, config: LossConfig) -> LossOutputs:
    """The named loss, plus β · KL to the reference when ``kl_beta`` > 0 and reference logprobs are given."""
    try:
        fn, _ = LOSSES[config.name]
    except KeyError:
        raise ValueError(f"unknown loss {config.name!r}; choose from {', '.join(LOSSES)}") from None
    policy = (
        inputs if inputs.correction is None else replace(inputs, weights=inputs.weights * inputs.correction)
    )
    out = fn(policy, config)
    if config.kl_beta > 0:
        if inputs.ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs ref_logprobs")
        q = inputs.ref_logprobs - inputs.logprobs
        kl = torch.exp(q) - q - 1  # k3: unbiased, never negative
        out.loss = out.loss + config.kl_beta * (inputs.weights * kl).sum()
        out.metrics["kl"] = (kl * inputs.mask).sum().detach()
    return out

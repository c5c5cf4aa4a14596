"""The sampler-vs-trainer mismatch: how large it is, and the two standard corrections (TIS, MIS).

For each sampled token, δ = logp_trainer − logp_sampler: ``logp_trainer`` is the trainer's logprob
of the token under the weights it is about to update (before the batch's first optimizer step),
``logp_sampler`` the one the sampler reported. δ is 0 when both computed the same policy the same
way; it grows with stale weights (asynchronous steps, ``train.max_off_policy_steps``), different
kernels or precision (a bf16 vLLM against a float32 trainer) and the sampler's truncation
(``top_p``).

Diagnostics (``mismatch_sums``): the mean of δ, the largest |δ|, and KL(sampler ‖ trainer) by the
k3 estimator exp(δ) − δ − 1 (unbiased for tokens drawn from the sampler, never negative;
Schulman 2020).

Corrections (``correction_weights``): the importance weight ρ = exp(δ) re-weights each token from
the sampler's policy to the trainer's, made safe one of two ways (or both):

- TIS, truncated importance sampling: the weight is min(ρ, C), C = ``tis_cap`` (Yao et al. 2025,
  "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").
- MIS, masked importance sampling: tokens whose ρ leaves [``mis_low``, ``mis_high``] (``"token"``),
  or every token of a sequence whose geometric-mean ρ leaves it (``"sequence"``), weigh 0
  (Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch"). A masked token still counts in the loss's normaliser.

With a correction on, the loss's ratio is taken against the trainer's own logprobs before the
update instead of the sampler's (the decoupled objective of Hilton et al. 2021, "Batch
size-invariance for policy optimization"): the correction carries the mismatch, the loss's clip
the update. The weights are constants (no gradient flows through them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

MisLevel = Literal["none", "token", "sequence"]


@dataclass(frozen=True)
class MismatchConfig:
    """Which corrections apply: ``tis_cap`` > 0 truncates ρ there; ``mis`` masks outside the band."""

    tis_cap: float = 0.0
    mis: MisLevel = "none"
    mis_low: float = 0.5
    mis_high: float = 2.0

    @property
    def enabled(self) -> bool:
        return self.tis_cap > 0 or self.mis != "none"


@dataclass(frozen=True)
class Correction:
    """Per-token weights of the policy objective [B, T], and which tokens TIS truncated, MIS masked."""

    weights: torch.Tensor
    truncated: torch.Tensor
    masked: torch.Tensor


def correction_weights(log_ratio: torch.Tensor, mask: torch.Tensor, config: MismatchConfig) -> Correction:
    """The correction of each token at ``mask`` [B, T] (each row one sequence), from δ = ``log_ratio``.

    Off (``config.enabled`` false): weight 1 at every trained token. On: ρ, truncated at ``tis_cap``
    when set, times 0 where MIS masks. 0 outside ``mask`` either way."""
    log_ratio = log_ratio.detach().float()
    trained = mask.float()
    none = torch.zeros_like(mask)
    if not config.enabled:
        return Correction(trained, none, none)
    rho = torch.exp(log_ratio)
    weight, truncated = rho, none
    if config.tis_cap > 0:
        truncated = (rho > config.tis_cap) & mask
        weight = rho.clamp(max=config.tis_cap)
    keep = torch.ones_like(mask)
    if config.mis == "token":
        keep = (rho >= config.mis_low) & (rho <= config.mis_high)
    elif config.mis == "sequence":
        tokens = trained.sum(dim=1).clamp(min=1)
        geometric = torch.exp((log_ratio * trained).sum(dim=1) / tokens)
        keep = ((geometric >= config.mis_low) & (geometric <= config.mis_high))[:, None].expand_as(mask)
    masked = ~keep & mask
    return Correction(weight * trained * keep, truncated, masked)


def mismatch_sums(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Over the tokens at ``mask``: Σδ, max |δ|, Σ(exp(δ) − δ − 1) and the count (the trainer divides)."""
    delta = log_ratio.detach().float()[mask]
    if delta.numel() == 0:
        return {"log_ratio": 0.0, "log_ratio_max": 0.0, "kl": 0.0, "tokens": 0.0}
    return {
        "log_ratio": float(delta.sum()),
        "log_ratio_max": float(delta.abs().max()),
        "kl": float(
            (torch.exp(delta.double()) - delta.double() - 1).sum()
        ),  # float64: exact near 0, never < 0
        "tokens": float(delta.numel()),
    }

"""The sampler-vs-trainer mismatch: its diagnostics and the TIS and MIS corrections against
hand-computed values, and how the loss applies them (the policy term only, never the KL term)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from palaestra.train.losses import LossConfig, LossInputs, compute_loss  # noqa: E402 - after the torch skip
from palaestra.train.mismatch import MismatchConfig, correction_weights, mismatch_sums  # noqa: E402

LN2 = math.log(2)
# two sequences of three positions; the last position of the second is padding
DELTA = torch.tensor([[0.0, LN2, -LN2], [math.log(4), math.log(0.25), 0.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def close(tensor: torch.Tensor, expected: list[list[float]]) -> bool:
    return torch.allclose(tensor, torch.tensor(expected), atol=1e-6)


def test_diagnostics_are_the_mean_and_largest_log_ratio_and_the_k3_kl() -> None:
    sums = mismatch_sums(DELTA, MASK)
    assert sums["tokens"] == 5
    assert sums["log_ratio"] == pytest.approx(0.0, abs=1e-6)  # 0 + ln2 - ln2 + ln4 - ln4
    assert sums["log_ratio_max"] == pytest.approx(math.log(4))
    # exp(d) - d - 1 for d = 0, ln2, -ln2, ln4, -ln4
    expected = 0 + (1 - LN2) + (0.5 + LN2 - 1) + (3 - math.log(4)) + (0.25 + math.log(4) - 1)
    assert sums["kl"] == pytest.approx(expected, rel=1e-6)
    assert mismatch_sums(DELTA, torch.zeros_like(MASK))["tokens"] == 0


def test_off_every_trained_token_weighs_one() -> None:
    out = correction_weights(DELTA, MASK, MismatchConfig())
    assert out.weights.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert not out.truncated.any() and not out.masked.any()


def test_tis_weighs_each_token_by_its_ratio_truncated_at_the_cap() -> None:
    out = correction_weights(DELTA, MASK, MismatchConfig(tis_cap=2.0))
    assert close(out.weights, [[1.0, 2.0, 0.5], [2.0, 0.25, 0.0]])  # rho 4 -> 2
    assert out.truncated.tolist() == [[False, False, False], [True, False, False]]
    assert not out.masked.any()


def test_token_mis_masks_the_tokens_whose_ratio_leaves_the_band() -> None:
    out = correction_weights(DELTA, MASK, MismatchConfig(mis="token", mis_low=0.5, mis_high=2.0))
    assert close(out.weights, [[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])  # 4 and 0.25 leave it
    assert out.masked.tolist() == [[False, False, False], [True, True, False]]


def test_sequence_mis_masks_whole_sequences_by_their_geometric_mean_ratio() -> None:
    delta = torch.tensor([[LN2, LN2, 0.0], [math.log(4), math.log(4), 0.0]])
    # geometric means over the trained tokens: 2^(2/3) = 1.59 (kept), 4 (masked: above 2)
    out = correction_weights(delta, MASK, MismatchConfig(mis="sequence", mis_low=0.5, mis_high=2.0))
    assert close(out.weights, [[2.0, 2.0, 1.0], [0.0, 0.0, 0.0]])
    assert out.masked.tolist() == [[False, False, False], [True, True, False]]


def test_tis_and_mis_together_truncate_what_the_band_keeps() -> None:
    out = correction_weights(DELTA, MASK, MismatchConfig(tis_cap=1.5, mis="token", mis_low=0.4, mis_high=3))
    assert close(out.weights, [[1.0, 1.5, 0.5], [0.0, 0.0, 0.0]])
    assert out.truncated.tolist() == [[False, True, False], [True, False, False]]


def test_the_loss_applies_the_correction_to_the_policy_term_and_not_to_the_kl_term() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.tensor([[True, True]])
    weights = torch.tensor([[0.5, 0.5]])
    correction = torch.tensor([[2.0, 0.0]])
    inputs = LossInputs(
        logprobs,
        logprobs.detach(),
        torch.tensor([1.0]),
        mask,
        weights,
        ref_logprobs=torch.tensor([[-1.5, -2.5]]),
        correction=correction,
    )
    out = compute_loss(inputs, LossConfig(name="dapo", kl_beta=0.1))
    # policy: -(0.5 * 2 * r * A + 0.5 * 0 * r * A) with r = 1, A = 1; KL: k3 of q = -0.5 at both tokens
    k3 = math.exp(-0.5) + 0.5 - 1
    assert out.loss.item() == pytest.approx(-1.0 + 0.1 * (0.5 * k3 + 0.5 * k3), rel=1e-6)
    out.loss.backward()
    assert logprobs.grad is not None and logprobs.grad[0, 1].item() != 0  # the KL term still trains it

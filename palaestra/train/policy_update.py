"""One policy update: a batch of sampled token sequences → loss → gradients → optimizer step.

The sequences (``rollout_tokens.py``) are cut into micro-batches of at most ``micro_batch_tokens``
tokens, padding included; each token's weight in the loss comes from the whole batch
(``losses.token_weights``), so the cut changes memory, not the gradient. The output layer runs on
the sampled positions only: the prompt and the environment's messages are context, not targets.

The first pass also measures the sampler-vs-trainer mismatch (``mismatch.py``): its logprobs,
before any optimizer step, against the sampler's. With a correction (TIS, MIS) on, every pass's
ratios are taken against those first-pass logprobs and the correction weighs each token.

With ``share_prefix``, the leading tokens every sequence of the batch starts with and none trains
on (an environment's system prompt: ~250 of a tic-tac-toe game's ~850) run once per pass
(``prefix.py``); each micro-batch continues from their keys and values. Same loss and gradients,
to float rounding (tested).

Under torchrun (``distributed.py``) each rank updates on its share of the batch's groups: the
token weights count the trained tokens and rollouts of *every* rank's share, and the gradients are
summed over the ranks before clipping, so N ranks take the one-process step. A rank whose share
trains nothing still takes part in each pass's sums. With FSDP (``fsdp.py``) the sums land in each
rank's shards and the optimizer steps on those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from palaestra.train import fsdp
from palaestra.train.distributed import World
from palaestra.train.losses import (
    LOSSES,
    BatchCounts,
    LossConfig,
    LossInputs,
    batch_counts,
    compute_loss,
    token_weights,
)
from palaestra.train.mismatch import MismatchConfig, correction_weights, mismatch_sums
from palaestra.train.prefix import SharedPrefix, common_prefix_length
from palaestra.train.rollout_tokens import TokenSequence


class Diverged(RuntimeError):
    """The loss or the gradient is not finite: the update was not applied."""

    def __init__(self, what: str, value: float) -> None:
        super().__init__(f"the {what} is {value}")
        self.what, self.value = what, value


@dataclass
class UpdateStats:
    """What one update did, summed over its passes' last pass (per token where it says so)."""

    loss: float
    grad_norm: float
    trained_tokens: int
    clipped_fraction: float  # tokens whose ratio was clipped, capped or masked
    ratio_mean: float  # the policy/sampler ratio of the trained tokens: 1 when they agree
    entropy: float  # mean entropy of the policy at the trained tokens (nats)
    kl: float | None
    mismatch: dict[str, float] = field(default_factory=dict)  # the first pass's, see ``mismatch_stats``
    shared_prefix: int = 0  # tokens run once per pass for every sequence (``share_prefix``)


def micro_batch_indices(
    sequences: Sequence[TokenSequence], max_tokens: int, start: int = 0
) -> list[list[int]]:
    """Sequence indices grouped so that rows × longest row ≤ ``max_tokens`` (a longer one goes
    alone), each row counted from token ``start`` on (after a shared prefix)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].input_ids), reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(sequences[groups[-1][0]].input_ids) - start) * (len(groups[-1]) + 1) <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def sampled_logprobs(
    backbone: Any,
    head: Any,
    inputs: torch.Tensor,
    attention: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logprobs of the tokens at ``mask`` (positions of ``inputs[:, 1:]``), and the full
    log-distributions there (for the entropy); the output layer runs on those positions only.

    The logits are divided by the sampling ``temperature``, as the sampler did: the ratio to the
    sampler's logprobs is then 1 for unchanged weights at any temperature. With a ``prefix``, the
    rows continue it (``inputs`` are their tokens after it; the padding is at the end, where
    causal attention never looks back from a real token, so no attention mask is needed)."""
    if prefix is None:
        hidden = backbone(input_ids=inputs, attention_mask=attention, use_cache=False).last_hidden_state
    else:
        rows, width = inputs.shape
        positions = torch.arange(prefix.length, prefix.length + width, device=inputs.device).expand(rows, -1)
        hidden = backbone(
            input_ids=inputs, position_ids=positions, use_cache=True, **prefix.cache_for(rows)
        ).last_hidden_state
    logp_all = (head(hidden[:, :-1][mask]).float() / temperature).log_softmax(-1)
    return logp_all.gather(1, inputs[:, 1:][mask][:, None]).squeeze(1), logp_all


def _padded(rows: Sequence[Sequence[Any]], fill: Any, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)


def policy_update(
    model: Any,
    head: Any,
    backbone: Any,
    optimizer: Any,
    scheduler: Any,
    sequences: Sequence[TokenSequence],
    loss_config: LossConfig,
    *,
    passes: int,
    micro_batch_tokens: int,
    max_grad_norm: float,
    device: torch.device,
    bf16: bool,
    pad_id: int,
    temperature: float = 1.0,
    reference: tuple[Any, Any] | None = None,
    mismatch: MismatchConfig | None = None,
    world: World | None = None,
    share_prefix: bool = False,
    shards: fsdp.Shards | None = None,
) -> UpdateStats:
    """``passes`` optimizer steps on ``sequences``; ``Diverged`` before touching the weights if not finite.

    ``temperature`` is the sampler's (logprobs are of the distribution it sampled from);
    ``reference`` is the (backbone, output layer) of the frozen starting model, for the KL penalty;
    ``mismatch`` the sampler-mismatch corrections (none by default); ``world`` the training
    processes, when ``sequences`` is this rank's share of the batch (the returned figures are the
    whole batch's); ``share_prefix`` runs the sequences' common untrained start once per pass;
    ``shards`` the model's FSDP shards (``train.fsdp``), gathered whole again after each step.
    """
    mismatch = mismatch or MismatchConfig()
    world = world or World()
    _, normalizer = LOSSES[loss_config.name]
    targets_mask = torch.zeros((0, 0), dtype=torch.bool)
    rollouts = torch.zeros(0, dtype=torch.long)
    if sequences:
        # position t predicts t + 1
        targets_mask = _padded([s.mask[1:] for s in sequences], False, torch.bool)
        rollouts = torch.tensor([s.rollout for s in sequences], dtype=torch.long)
    mine = batch_counts(targets_mask, rollouts)
    tokens, count = world.sum([mine.tokens, mine.rollouts])  # the whole batch's, over every rank
    weights_all = token_weights(
        targets_mask,
        normalizer,
        max_tokens=loss_config.max_tokens,
        rollouts=rollouts,
        batch=BatchCounts(tokens=int(tokens), rollouts=int(count)),
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]  # the shards, with FSDP
    shared = 0
    if share_prefix and sequences:
        shared = common_prefix_length(
            [s.input_ids for s in sequences], [s.mask.index(True) for s in sequences]
        )
    groups = micro_batch_indices(sequences, micro_batch_tokens, start=shared)
    most = shards.most(len(groups)) if shards is not None else 0  # the layer mode: as many on every rank
    stats = UpdateStats(0.0, 0.0, int(tokens), 0.0, 0.0, 0.0, None)
    # with a correction on: each micro-batch's first-pass logprobs and correction weights
    first: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    measured = dict.fromkeys(("log_ratio", "log_ratio_max", "kl", "tokens", "truncated", "masked"), 0.0)
    for pass_index in range(passes):
        sums = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "entropy": 0.0, "kl": 0.0}
        prefix = ref_prefix = None
        if shards is not None:
            shards.begin()  # the layer mode: each layer gathered by its own passes from here on
        if shared:  # this pass's weights: computed again each pass
            ids = sequences[0].input_ids[:shared]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                prefix = SharedPrefix(backbone, ids, device)
                if reference is not None:
                    with torch.no_grad():
                        ref_prefix = SharedPrefix(reference[0], ids, device)
        for g, group in enumerate(groups):
            rows = [sequences[i] for i in group]
            width = max(len(s.input_ids) for s in rows) - 1 - shared  # predicting positions, after the prefix
            inputs = _padded([s.input_ids[shared:] for s in rows], pad_id, torch.long).to(device)
            attention = _padded([[1] * (len(s.input_ids) - shared) for s in rows], 0, torch.long).to(device)
            mask = targets_mask[group, shared : shared + width].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                chosen, logp_all = sampled_logprobs(
                    backbone, head, inputs, attention, mask, temperature, prefix
                )
            logprobs = torch.zeros(mask.shape, device=device).masked_scatter(mask, chosen)
            ref = None
            if reference is not None:
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    ref_chosen, _ = sampled_logprobs(
                        *reference, inputs, attention, mask, temperature, ref_prefix
                    )
                ref = torch.zeros(mask.shape, device=device).masked_scatter(mask, ref_chosen)
            sampler = _padded([s.sampler_logprobs[1 + shared :] for s in rows], 0.0, torch.float32)[:, :width]
            sampler = sampler.to(device)
            if pass_index == 0:  # the weights the sampler should have had: measure how far it was
                old = logprobs.detach()
                correction = correction_weights(old - sampler, mask, mismatch)
                _add_measure(measured, mismatch_sums(old - sampler, mask), correction)
                if mismatch.enabled:
                    first[g] = (old, correction.weights)
            baseline, weigh = first.get(g, (sampler, None))
            advantages = torch.tensor([s.advantage for s in rows], dtype=torch.float32, device=device)
            out = compute_loss(
                LossInputs(
                    logprobs,
                    baseline,
                    advantages,
                    mask,
                    weights_all[group, shared : shared + width].to(device),
                    ref,
                    correction=weigh,
                ),
                loss_config,
            )
            # a non-finite loss stops the update below, on every rank; the layer mode's every backward
            # is a collective (its gradients are discarded then)
            if math.isfinite(out.loss.item()) or (shards is not None and shards.layers):
                out.loss.backward()
            with torch.no_grad():
                sums["entropy"] += float(-(logp_all.exp() * logp_all).sum(-1).sum())
            sums["loss"] += out.loss.item()
            for key in ("clipped", "ratio", "kl"):
                if key in out.metrics:
                    sums[key] += float(out.metrics[key])
        if shards is not None:
            shards.pad(backbone, head, device, pad_id, most - len(groups))
        if prefix is not None:
            prefix.backward()  # the gradients the micro-batches sent to the prefix's keys and values
        sums = dict(zip(sums, world.sum(list(sums.values())), strict=True))  # the whole batch's
        if pass_index == 0:
            measured = _whole_batch(measured, world)
        if not math.isfinite(sums["loss"]):
            optimizer.zero_grad(set_to_none=True)
            raise Diverged("loss", sums["loss"])
        fsdp.sum_gradients(params, world, shards)  # the one-process gradient, on every rank
        grad_norm = fsdp.clip_gradients(params, max_grad_norm if max_grad_norm > 0 else math.inf)
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise Diverged("gradient norm", grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if shards is not None:
            shards.gather()  # the updated weights, whole, for the next pass and the sampler
        n = max(stats.trained_tokens, 1)
        stats = UpdateStats(
            loss=sums["loss"],
            grad_norm=grad_norm,
            trained_tokens=stats.trained_tokens,
            clipped_fraction=sums["clipped"] / n,
            ratio_mean=sums["ratio"] / n,
            entropy=sums["entropy"] / n,
            kl=sums["kl"] / n if loss_config.kl_beta > 0 else None,
            mismatch=mismatch_stats(measured),
            shared_prefix=shared,
        )
    return stats


def _whole_batch(measured: dict[str, float], world: World) -> dict[str, float]:
    """The mismatch sums of every rank's share: added, and the largest ``log_ratio_max``."""
    keys = [k for k in measured if k != "log_ratio_max"]
    out = dict(zip(keys, world.sum([measured[k] for k in keys]), strict=True))
    out["log_ratio_max"] = world.max(measured["log_ratio_max"])
    return out


def _add_measure(measured: dict[str, float], sums: dict[str, float], correction: Any) -> None:
    for key in ("log_ratio", "kl", "tokens"):
        measured[key] += sums[key]
    measured["log_ratio_max"] = max(measured["log_ratio_max"], sums["log_ratio_max"])
    measured["truncated"] += float(correction.truncated.sum())
    measured["masked"] += float(correction.masked.sum())


def mismatch_stats(measured: dict[str, float]) -> dict[str, float]:
    """The logged mismatch figures: δ's mean and largest |δ|, the KL estimate (per token), and the
    fractions of trained tokens TIS truncated and MIS masked."""
    n = max(measured["tokens"], 1.0)
    return {
        "log_ratio_mean": measured["log_ratio"] / n,
        "log_ratio_max": measured["log_ratio_max"],
        "kl": measured["kl"] / n,
        "tis_truncated": measured["truncated"] / n,
        "mis_masked": measured["masked"] / n,
    }

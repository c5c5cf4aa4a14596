"""Rollouts to training sequences made of exactly the token ids the sampler produced.

Each model turn of a rollout carries the prompt ids it was sampled after and the completion ids
and logprobs it sampled (``Turn.prompt_token_ids``, ``.token_ids``, ``.logprobs``). A multi-turn
rollout becomes **one** sequence when every turn's prompt starts with the previous turn's prompt
plus completion — the chat template re-rendered the earlier turns to the same ids, checked per
rollout — and is otherwise split into one sequence per turn. Either way only sampled tokens are
trained: the prompt, the environment's and the user's messages, and template tokens the model
did not sample (the end-of-turn marker after a reply cut at ``max_tokens``) are masked.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from palaestra.types import Rollout


class TokenError(ValueError):
    """A rollout lacks the token ids training needs (a client that returns none)."""


@dataclass(frozen=True)
class TokenSequence:
    """One training sequence: ids, which of them were sampled, the sampler's logprobs, the advantage."""

    input_ids: list[int]
    mask: list[bool]  # True at tokens the model sampled: the ones trained
    sampler_logprobs: list[float]  # at sampled positions; 0.0 elsewhere
    advantage: float
    rollout: int  # index of the rollout it came from

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def rollout_sequences(rollout: Rollout, advantage: float, index: int = 0) -> list[TokenSequence]:
    """The training sequences of one rollout: one when its turns chain, else one per turn."""
    turns = [t for t in rollout.turns if t.token_ids != []]  # an empty reply trains nothing
    if not turns:
        return []
    for turn in turns:
        if (
            turn.token_ids is None
            or turn.prompt_token_ids is None
            or turn.logprobs is None
            or len(turn.logprobs) != len(turn.token_ids or [])
        ):
            raise TokenError(
                "a rollout to train on needs each turn's prompt ids, completion ids and logprobs: use a client "
                "that returns them (LocalClient does; for vLLM send return_token_ids and logprobs)"
            )
    if chains(rollout):
        ids: list[int] = []
        mask: list[bool] = []
        logprobs: list[float] = []
        for turn in turns:
            assert (
                turn.prompt_token_ids is not None and turn.token_ids is not None and turn.logprobs is not None
            )
            context = turn.prompt_token_ids[len(ids) :]  # what the environment and template added
            ids += context + turn.token_ids
            mask += [False] * len(context) + [True] * len(turn.token_ids)
            logprobs += [0.0] * len(context) + list(turn.logprobs)
        return [TokenSequence(ids, mask, logprobs, advantage, index)]
    out = []
    for turn in turns:
        assert turn.prompt_token_ids is not None and turn.token_ids is not None and turn.logprobs is not None
        n_prompt = len(turn.prompt_token_ids)
        out.append(
            TokenSequence(
                turn.prompt_token_ids + turn.token_ids,
                [False] * n_prompt + [True] * len(turn.token_ids),
                [0.0] * n_prompt + list(turn.logprobs),
                advantage,
                index,
            )
        )
    return out


def chains(rollout: Rollout) -> bool:
    """Whether each turn's prompt ids start with the previous turn's prompt + completion ids."""
    turns = [t for t in rollout.turns if t.token_ids]
    for before, after in itertools.pairwise(turns):
        if before.prompt_token_ids is None or before.token_ids is None or after.prompt_token_ids is None:
            return False
        sampled = before.prompt_token_ids + before.token_ids
        if after.prompt_token_ids[: len(sampled)] != sampled:
            return False
    return True


def batch_sequences(rollouts: Sequence[Rollout], advantages: Sequence[float]) -> list[TokenSequence]:
    """Every rollout's sequences, rollouts with a zero advantage included (they count in the mean)."""
    out: list[TokenSequence] = []
    for i, (rollout, advantage) in enumerate(zip(rollouts, advantages, strict=True)):
        out.extend(rollout_sequences(rollout, advantage, i))
    return out


def cut_to_length(sequences: Sequence[TokenSequence], max_length: int) -> tuple[list[TokenSequence], int]:
    """``sequences`` with those longer than ``max_length`` tokens cut there (their later sampled
    tokens are not trained; under causal attention the earlier ones are unchanged), and how many
    were cut. ``max_length`` 0: no limit."""
    if max_length <= 0:
        return list(sequences), 0
    out = []
    cut = 0
    for seq in sequences:
        if len(seq.input_ids) > max_length:
            cut += 1
            seq = replace(
                seq,
                input_ids=seq.input_ids[:max_length],
                mask=seq.mask[:max_length],
                sampler_logprobs=seq.sampler_logprobs[:max_length],
            )
        out.append(seq)
    return out, cut

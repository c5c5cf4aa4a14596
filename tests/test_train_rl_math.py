"""The pure parts of RL: group advantages, the losses against hand-computed values, and rollouts
turned into exactly the sampled token ids."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.types import ErrorInfo, Turn

torch = pytest.importorskip("torch")

from palaestra.train.advantages import group_advantages  # noqa: E402 - after the torch skip
from palaestra.train.losses import LOSSES, LossConfig, LossInputs, compute_loss, token_weights  # noqa: E402
from palaestra.train.rollout_tokens import (  # noqa: E402
    TokenError,
    TokenSequence,
    chains,
    cut_to_length,
    rollout_sequences,
)


def r(example: int, index: int, reward: float | None) -> pa.Rollout:
    return pa.Rollout(example, index, 0, [], reward=reward)


# --- advantages ----------------------------------------------------------------------------------


def test_advantage_is_reward_minus_the_group_mean_and_flat_groups_count_as_zero() -> None:
    rollouts = [r(0, 0, 1.0), r(0, 1, 0.0), r(0, 2, 0.5), r(0, 3, 0.5), r(1, 0, 0.7), r(1, 1, 0.7)]
    adv = group_advantages(rollouts)
    assert adv.values == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    assert (adv.groups, adv.zero_groups, adv.dropped) == (2, 1, 0)


def test_failed_rollouts_are_dropped_and_their_group_judged_on_the_rest() -> None:
    failed = r(0, 2, None)
    errored = r(0, 3, 1.0)
    errored.error = ErrorInfo("KeyError", "x", "env")
    adv = group_advantages([r(0, 0, 1.0), r(0, 1, 0.0), failed, errored])
    assert [x.rollout_index for x in adv.rollouts] == [0, 1] and adv.values == pytest.approx([0.5, -0.5])
    assert adv.dropped == 2


def test_std_scalings() -> None:
    rollouts = [r(0, 0, 1.0), r(0, 1, 0.0), r(1, 0, 0.2), r(1, 1, 0.0)]
    by_group = group_advantages(rollouts, scale="group_std").values
    assert by_group == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-4)  # each group: ±0.5 / 0.5, ±0.1 / 0.1
    by_batch = group_advantages(rollouts, scale="batch_std").values
    std = math.sqrt((0.25 + 0.25 + 0.01 + 0.01) / 4)
    assert by_batch == pytest.approx([0.5 / std, -0.5 / std, 0.1 / std, -0.1 / std], abs=1e-4)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(rollouts, scale="rank")  # type: ignore[arg-type]  # a wrong value on purpose


# --- losses: one batch of two sequences, worked by hand --------------------------------------------
# sequence 0: two sampled tokens, p = 0.5, 0.2 (the sampler said 0.4, 0.2): ratios 1.25, 1.0; A = +1
# sequence 1: one sampled token, p = 0.3 (the sampler said 0.6): ratio 0.5; A = -1


def batch(normalizer: str, max_tokens: int = 3) -> LossInputs:
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logprobs = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.9, 0.9]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.6, 0.1, 0.1]]))
    weights = token_weights(mask, normalizer, max_tokens=max_tokens)  # type: ignore[arg-type]  # a literal
    return LossInputs(logprobs, sampler, torch.tensor([1.0, -1.0]), mask, weights)


def grads(inputs: LossInputs, config: LossConfig) -> tuple[float, list[float]]:
    out = compute_loss(inputs, config)
    out.loss.backward()
    assert inputs.logprobs.grad is not None
    g = inputs.logprobs.grad
    return out.loss.item(), [g[0, 0].item(), g[0, 1].item(), g[1, 0].item(), g[0, 2].item()]


def test_grpo_clips_the_ratio_and_averages_per_sequence() -> None:
    # objectives: min(1.25, 1.2) = 1.2 (clipped), 1.0, min(-0.5, -0.8) = -0.8 (clipped)
    # weights: 1/(2 tokens × 2 sequences) = 0.25, 0.25; 1/(1 × 2) = 0.5
    loss, g = grads(batch("sequence"), LossConfig("grpo", eps_low=0.2))
    assert loss == pytest.approx(-(0.25 * 1.2 + 0.25 * 1.0 + 0.5 * -0.8))
    assert g == pytest.approx([0.0, -0.25, 0.0, 0.0])  # clipped tokens get no gradient; padding none


def test_dr_grpo_has_a_constant_normaliser() -> None:
    loss, _ = grads(batch("constant", max_tokens=3), LossConfig("dr_grpo"))
    assert loss == pytest.approx(-(1.2 + 1.0 - 0.8) / (2 * 3))


def test_dapo_clips_higher_and_averages_over_tokens() -> None:
    # upper clip 1.28 leaves 1.25 alone: objectives 1.25, 1.0, -0.8
    loss, g = grads(batch("token"), LossConfig("dapo", eps_low=0.2, eps_high=0.28))
    assert loss == pytest.approx(-(1.25 + 1.0 - 0.8) / 3)
    assert g == pytest.approx([-1.25 / 3, -1.0 / 3, 0.0, 0.0])  # d(r·A)/dlogp = r·A


def test_cispo_caps_the_detached_weight_and_keeps_every_tokens_gradient() -> None:
    inputs = batch("token")
    loss, g = grads(inputs, LossConfig("cispo", eps_high=0.2))  # cap 1.2: weights 1.2, 1.0, 0.5
    expected = -(1.2 * math.log(0.5) + 1.0 * math.log(0.2) - 0.5 * math.log(0.3)) / 3
    assert loss == pytest.approx(expected)
    assert g == pytest.approx([-1.2 / 3, -1.0 / 3, 0.5 / 3, 0.0])  # none zeroed, the capped one too


def test_masked_is_drops_tokens_whose_ratio_left_the_band() -> None:
    inputs = batch("token")
    with torch.no_grad():
        inputs.sampler_logprobs[0, 1] = math.log(0.2 / 10)  # ratio 10 > 8: masked
    loss, g = grads(inputs, LossConfig("masked_is"))
    assert loss == pytest.approx(-(1.25 - 0.5) / 3)
    assert g == pytest.approx([-1.25 / 3, 0.0, 0.5 / 3, 0.0])


def test_kl_penalty_uses_k3_and_is_zero_at_the_reference() -> None:
    inputs = batch("token")
    plain = compute_loss(inputs, LossConfig("masked_is")).loss.item()
    at_ref = LossInputs(**{**inputs.__dict__, "ref_logprobs": inputs.logprobs.detach().clone()})
    assert compute_loss(at_ref, LossConfig("masked_is", kl_beta=0.5)).loss.item() == pytest.approx(plain)
    shifted = LossInputs(**{**inputs.__dict__, "ref_logprobs": inputs.logprobs.detach() + 0.1})
    kl = math.exp(0.1) - 0.1 - 1
    assert compute_loss(shifted, LossConfig("masked_is", kl_beta=0.5)).loss.item() == pytest.approx(
        plain + 0.5 * kl
    )


@pytest.mark.parametrize("name", list(LOSSES))
def test_micro_batches_sum_to_the_whole_batch(name: str) -> None:
    torch.manual_seed(0)
    mask = torch.rand(6, 5) > 0.3
    logprobs = -torch.rand(6, 5)
    sampler = logprobs + 0.2 * torch.randn(6, 5)
    adv = torch.randn(6)
    _, normalizer = LOSSES[name]
    weights = token_weights(mask, normalizer, max_tokens=5)
    config = LossConfig(name)
    whole = compute_loss(LossInputs(logprobs, sampler, adv, mask, weights), config).loss
    parts = sum(
        compute_loss(LossInputs(logprobs[s], sampler[s], adv[s], mask[s], weights[s]), config).loss
        for s in (slice(0, 2), slice(2, 6))
    )
    assert float(parts) == pytest.approx(float(whole))


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_rollout_split_into_turns_weighs_as_one_rollout(name: str) -> None:
    """A rollout whose turns do not chain becomes one row per turn; it must weigh what the same
    tokens chained into one row weigh, and the batch's normaliser counts rollouts, not rows."""
    from palaestra.train.policy_update import _padded

    chained = TokenSequence([0] * 60, [False] * 20 + [True] * 40, [0.0] * 60, 1.0, 0)
    split = [TokenSequence([0] * 30, [False] * 20 + [True] * 10, [0.0] * 30, -1.0, 1) for _ in range(4)]
    as_one = TokenSequence([0] * 60, [False] * 20 + [True] * 40, [0.0] * 60, -1.0, 1)
    _, normalizer = LOSSES[name]

    def per_rollout(rows: list[TokenSequence]) -> list[float]:
        mask = _padded([s.mask[1:] for s in rows], False, torch.bool)
        ids = torch.tensor([s.rollout for s in rows])
        w = token_weights(mask, normalizer, max_tokens=48, rollouts=ids).sum(1)
        return [float(w[ids == i].sum()) for i in (0, 1)]

    split_weights, chained_weights = per_rollout([chained, *split]), per_rollout([chained, as_one])
    assert split_weights == pytest.approx(chained_weights)
    if normalizer == "sequence":  # GRPO: a mean over rollouts, each the mean over its own tokens
        assert split_weights == pytest.approx([0.5, 0.5])


def test_unknown_loss_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown loss 'ppo'; choose from grpo"):
        compute_loss(batch("token"), LossConfig("ppo"))


# --- rollouts to sampled tokens --------------------------------------------------------------------


def turn(prompt: list[int], completion: list[int], finish: str = "stop") -> Turn:
    return Turn(
        0,
        0,
        finish_reason=finish,
        token_ids=completion,
        logprobs=[-0.1 * t for t in completion],
        prompt_token_ids=prompt,
    )


def test_a_multi_turn_rollout_whose_turns_chain_is_one_sequence_training_only_sampled_tokens() -> None:
    rollout = r(0, 0, 1.0)
    # turn 2's prompt re-renders turn 1 to the same ids, then adds the environment's message [7, 8]
    rollout.turns = [turn([1, 2, 3], [40, 41, 2]), turn([1, 2, 3, 40, 41, 2, 7, 8], [50, 2])]
    assert chains(rollout)
    (seq,) = rollout_sequences(rollout, advantage=0.5)
    assert seq.input_ids == [1, 2, 3, 40, 41, 2, 7, 8, 50, 2]
    assert [t for t, m in zip(seq.input_ids, seq.mask, strict=True) if m] == [40, 41, 2, 50, 2]
    assert seq.sampler_logprobs == pytest.approx([0, 0, 0, -4.0, -4.1, -0.2, 0, 0, -5.0, -0.2])
    assert seq.advantage == 0.5 and seq.trained_tokens == 5


def test_turns_that_do_not_chain_become_one_sequence_each() -> None:
    rollout = r(0, 0, 1.0)
    # the template re-tokenised turn 1's reply differently ([40, 41] became [42])
    rollout.turns = [turn([1, 2], [40, 41, 2]), turn([1, 2, 42, 2, 7], [50, 2])]
    assert not chains(rollout)
    first, second = rollout_sequences(rollout, advantage=-1.0)
    assert (first.input_ids, first.mask) == ([1, 2, 40, 41, 2], [False, False, True, True, True])
    assert (second.input_ids, second.mask) == ([1, 2, 42, 2, 7, 50, 2], [False] * 5 + [True, True])


def test_a_reply_cut_at_max_tokens_leaves_the_templates_end_marker_untrained() -> None:
    rollout = r(0, 0, 1.0)
    rollout.turns = [turn([1], [40, 41], finish="length"), turn([1, 40, 41, 2, 7], [50, 2])]
    (seq,) = rollout_sequences(rollout, advantage=1.0)
    assert seq.input_ids == [1, 40, 41, 2, 7, 50, 2]
    assert seq.mask == [False, True, True, False, False, True, True]  # the 2 after 41 was not sampled


def test_a_rollout_without_token_ids_is_a_clear_error() -> None:
    rollout = r(0, 0, 1.0)
    rollout.turns = [Turn(0, 0, token_ids=[4, 5], logprobs=None, prompt_token_ids=[1])]
    with pytest.raises(TokenError, match="prompt ids, completion ids and logprobs"):
        rollout_sequences(rollout, 1.0)


# --- token-exact: a real multi-turn game sampled by LocalClient ------------------------------------


async def test_the_trained_tokens_of_a_tic_tac_toe_rollout_are_exactly_the_sampled_ones(
    tiny_tictactoe_model_dir: Path,
) -> None:
    from palaestra.clients.local import LocalClient

    env = pa.load_environment("tictactoe", num_examples=4, opponent="random", max_turns=3)
    client = LocalClient(tiny_tictactoe_model_dir, name="tiny")
    try:
        spec = pa.RunSpec(rollouts_per_example=2, sampling=pa.Sampling(max_tokens=6, logprobs=True), seed=3)
        rollouts = await env.run(client, spec)
    finally:
        await client.aclose()
    assert sum(len(r.turns) for r in rollouts) > len(rollouts), "the games must have several turns"
    for rollout in rollouts:
        sequences = rollout_sequences(rollout, advantage=1.0)
        # a random model's replies can end inside a UTF-8 character, which the next prompt re-renders
        # as other ids: such rollouts are trained turn by turn; the others as one sequence
        assert len(sequences) == (1 if chains(rollout) else len(rollout.turns))
        trained = [t for seq in sequences for t, m in zip(seq.input_ids, seq.mask, strict=True) if m]
        assert trained == [t for turn in rollout.turns for t in turn.token_ids or ()]
        logprobs = [
            lp for seq in sequences for lp, m in zip(seq.sampler_logprobs, seq.mask, strict=True) if m
        ]
        assert logprobs == [lp for turn in rollout.turns for lp in turn.logprobs or ()]
        for seq, turn in zip(
            sequences, rollout.turns if len(sequences) > 1 else rollout.turns[-1:], strict=True
        ):
            assert seq.input_ids[: len(turn.prompt_token_ids or [])] == turn.prompt_token_ids  # what it saw


def canonical_client(tokenizer: Any) -> pa.ScriptedClient:
    """The heuristic player, answering as a sampler would that samples the canonical tokenisation."""
    import tictactoe

    from palaestra.chat_template import prompt_ids

    def reply(messages: pa.Messages, rng: Any) -> pa.ModelResponse:
        text = tictactoe.heuristic_player(messages, rng)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return pa.ModelResponse(
            {"role": "assistant", "content": text},
            "stop",
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            prompt_token_ids=prompt_ids(tokenizer, messages),
        )

    return pa.ScriptedClient(reply)


async def test_a_chatml_template_re_renders_earlier_turns_so_a_whole_game_is_one_sequence(
    tiny_tictactoe_model_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tictactoe_model_dir)
    env = pa.load_environment("tictactoe", num_examples=6, opponent="optimal")
    rollouts = await env.run(canonical_client(tokenizer), pa.RunSpec(seed=1))
    assert all(len(r.turns) >= 3 for r in rollouts)
    for rollout in rollouts:
        assert chains(rollout)
        (seq,) = rollout_sequences(rollout, advantage=0.5)
        trained = [t for t, m in zip(seq.input_ids, seq.mask, strict=True) if m]
        assert trained == [t for turn in rollout.turns for t in turn.token_ids or ()]
        # the untrained tokens are the prompt and the environment's turns, as the template renders them
        played = rollout.messages[:-1] if rollout.messages[-1]["role"] == "user" else rollout.messages
        rendered = tokenizer.apply_chat_template(played, tokenize=False)
        assert tokenizer.decode(seq.input_ids) == rendered.removesuffix("\n")  # ends at the last <|im_end|>


def test_sequences_longer_than_max_length_are_cut_and_counted() -> None:
    long = TokenSequence(list(range(10)), [False] * 4 + [True] * 6, [0.0] * 4 + [-0.5] * 6, 1.0, 0)
    short = TokenSequence([1, 2, 3], [False, True, True], [0.0, -0.1, -0.2], -1.0, 1)
    out, cut = cut_to_length([long, short], 6)
    assert cut == 1 and out[1] == short
    assert out[0].input_ids == list(range(6)) and out[0].mask == [False] * 4 + [True] * 2
    assert out[0].sampler_logprobs == [0.0] * 4 + [-0.5] * 2 and out[0].advantage == 1.0
    assert cut_to_length([long], 0) == ([long], 0)

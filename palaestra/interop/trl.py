"""TRL's ``GRPOTrainer`` on a palaestra environment: a rollout function, a reward function, a dataset.

TRL (1.16) lets a trainer replace its own generation with ``rollout_func(prompts, trainer)``,
which returns per prompt ``prompt_ids``, ``completion_ids`` and ``logprobs``, optionally an
``env_mask`` (1 on tokens the model sampled, 0 on tokens from elsewhere: only the 1s are
trained), and any other fields, which TRL hands to the reward functions by name. Here:

- ``PalaestraRollouts`` is that function. It plays every prompt's episode with the environment's
  own ``rollout`` and scores each group with its rubric, as ``palaestra eval`` does, through a
  ``LocalClient`` on the trainer's model (or the client it is given). A multi-turn rollout
  becomes one sequence: the first prompt's ids, then the model's and the environment's tokens as
  they chained (``palaestra.train.rollout_tokens``), the environment's masked out.
- ``palaestra_reward`` is the reward function that passes the rubric's reward through.
- ``train_dataset`` is the environment's examples as TRL's ``prompt`` column; each prompt
  carries its example id (TRL's rollout function sees only the prompts, and different examples
  can share a prompt, e.g. tic-tac-toe games whose opponents differ).

TRL itself is not imported: the trainer is used by the attributes TRL 1.16 documents.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from palaestra.clients.base import ModelClient
from palaestra.clients.limited import LimitedClient
from palaestra.envs.base import Environment
from palaestra.train.rollout_tokens import TokenError
from palaestra.types import Example, Rollout, Sampling, Turn, content_text, derive_seed

if TYPE_CHECKING:
    from datasets import Dataset

    from palaestra.clients.local import LocalClient

EXAMPLE_KEY = "palaestra_example"  # on a prompt's first message: the example id it stands for
REWARD_KEY = "palaestra_reward"  # the rollout function's field of rubric rewards
METRICS_KEY = "palaestra_metrics"  # ... and of the rubric's metrics, one dict per rollout

log = logging.getLogger(__name__)
T = TypeVar("T")


def train_dataset(env: Environment, num_examples: int = -1) -> Dataset:
    """The first ``num_examples`` examples (-1: all) as a ``datasets.Dataset`` with TRL's ``prompt``
    column (conversational) and an ``example_id`` column; the first message of each prompt
    carries the example id under ``palaestra_example``, which ``PalaestraRollouts`` reads back."""
    from datasets import Dataset

    rows = []
    for example in env.select(num_examples):
        # role and text only: one Arrow type for every row; the rollout plays the example's own prompt
        prompt: list[dict[str, Any]] = [
            {"role": str(m.get("role")), "content": content_text(m.get("content")), EXAMPLE_KEY: None}
            for m in example.prompt
        ]
        prompt[0][EXAMPLE_KEY] = example.id
        rows.append({"prompt": prompt, "example_id": example.id})
    return Dataset.from_list(rows)


def palaestra_reward(
    completions: list[Any], palaestra_reward: list[float | None] | None = None, **kwargs: Any
) -> list[float | None]:
    """The rubric's reward of each rollout, as ``PalaestraRollouts`` returned it (``None`` for a
    rollout that failed: TRL leaves it out of its group's baseline and gives it no advantage)."""
    if palaestra_reward is None:
        raise ValueError(
            f"palaestra_reward needs the {REWARD_KEY!r} field: pass rollout_func=PalaestraRollouts(env) to "
            "GRPOTrainer along with it"
        )
    if len(palaestra_reward) != len(completions):
        raise ValueError(f"{len(palaestra_reward)} rewards for {len(completions)} completions")
    return list(palaestra_reward)


class PalaestraRollouts:
    """``rollout_func`` for TRL's ``GRPOTrainer``: palaestra's episodes, rewards and token ids.

    ``client`` ``None`` samples from the trainer's own model through a ``LocalClient`` (built on
    the first call; its cached prefixes are dropped before each call, since the weights changed).
    Another client (a vLLM server, say) is the caller's to keep in sync with the trainer.
    ``sampling`` ``None`` is the environment's, with TRL's ``temperature`` where it sets none (TRL
    scores the sampled tokens at that temperature). The rollouts of a call use the seed
    ``seed_for(step, mode)``; ``last_rollouts`` and ``last_seed`` keep the latest call's.
    """

    def __init__(
        self,
        env: Environment,
        *,
        client: ModelClient | None = None,
        sampling: Sampling | None = None,
        seed: int = 0,
        max_concurrent: int = 32,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.env, self.client, self.sampling = env, client, sampling
        self.seed, self.max_concurrent = seed, max_concurrent
        self.examples = {e.id: e for e in env.examples}
        self.last_rollouts: list[Rollout] = []
        self.last_seed: int | None = None
        self._own_client: LocalClient | None = None  # built on the trainer's model
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def seed_for(self, step: int, mode: str = "train") -> int:
        """The run seed of the rollouts sampled at trainer step ``step`` (``mode``: train or eval)."""
        return derive_seed("palaestra/trl", self.seed, mode, step)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one episode per prompt; TRL's fields for each, in the prompts' order."""
        mode = "train" if trainer.model.training else "eval"
        group_size = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        examples = [self._example(p) for p in prompts]
        offset = trainer.accelerator.process_index * len(prompts)  # TRL slices the batch by process
        indices = [(offset + i) % group_size for i in range(len(prompts))]
        seed = self.seed_for(trainer.state.global_step, mode)
        sampling = self._sampling(trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        training = model.training
        model.eval()  # sampling without dropout; TRL's mode is restored below
        try:
            client = self._client(model, trainer.processing_class)
            rollouts = self._run(self._sample(client, examples, indices, seed, sampling))
        finally:
            model.train(training)
        self.last_rollouts, self.last_seed = rollouts, seed
        return trl_fields(rollouts, trainer.processing_class)

    def _example(self, prompt: Any) -> Example:
        key = (
            prompt[0].get(EXAMPLE_KEY)
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
            else None
        )
        if key is None:
            raise ValueError(
                f"a prompt without {EXAMPLE_KEY!r} on its first message: build the train dataset with "
                "palaestra.interop.trl.train_dataset(env)"
            )
        example = self.examples.get(int(key))
        if example is None:
            raise ValueError(f"prompt of example {key}, which the environment does not have")
        return example

    def _sampling(self, trainer: Any) -> Sampling:
        sampling = self.sampling or self.env.sampling
        if sampling.temperature is None:
            sampling = replace(sampling, temperature=float(trainer.temperature))
        return replace(sampling, logprobs=True)

    def _client(self, model: Any, tokenizer: Any) -> ModelClient:
        if self.client is not None:
            return self.client
        if self._own_client is None or self._own_client.hf_model is not model:
            from palaestra.clients.local import LocalClient

            if self._own_client is not None:
                self._run(self._own_client.aclose())
            self._own_client = LocalClient.from_model(model, tokenizer, max_batch_size=self.max_concurrent)
        return self._own_client

    async def _sample(
        self, client: ModelClient, examples: list[Example], indices: list[int], seed: int, sampling: Sampling
    ) -> list[Rollout]:
        own = self._own_client
        if own is not None and client is own:
            async with own.paused():  # drops the prefixes cached under older weights
                pass
        limited = LimitedClient(client, asyncio.Semaphore(self.max_concurrent))
        groups: list[list[int]] = []  # positions of each run of one example, as TRL repeats a prompt
        for position, example in enumerate(examples):
            if groups and examples[groups[-1][0]].id == example.id and indices[position] != 0:
                groups[-1].append(position)
            else:
                groups.append([position])

        async def group(positions: list[int]) -> list[Rollout]:
            example = examples[positions[0]]
            runs = [
                self.env.rollout(limited, example, rollout_index=indices[p], seed=seed, sampling=sampling)
                for p in positions
            ]
            rollouts = list(await asyncio.gather(*runs))
            await self.env.rubric.score_group(rollouts, [example] * len(rollouts))
            return rollouts

        done = await asyncio.gather(*(group(g) for g in groups))
        rollouts = [r for g in done for r in g]
        if rollouts and all(r.error is not None and r.error.stage == "model" for r in rollouts):
            first = rollouts[0].error
            assert first is not None
            raise RuntimeError(f"every rollout failed in the model: {first.type}: {first.message}")
        return rollouts

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this adapter's own event loop (a thread: TRL's loop, if any, is not ours)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="palaestra-trl", daemon=True)
            self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Stop the client built on the trainer's model and the adapter's event loop."""
        if self._loop is None:
            return
        if self._own_client is not None:
            self._run(self._own_client.aclose())
            self._own_client = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join()
        self._loop.close()
        self._loop = self._thread = None


def trl_fields(rollouts: Sequence[Rollout], tokenizer: Any) -> dict[str, list[Any]]:
    """TRL's rollout fields of ``rollouts``: ids, logprobs, ``env_mask``, rewards and metrics."""
    out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
    out[REWARD_KEY], out[METRICS_KEY] = [], []
    for rollout in rollouts:
        prompt_ids, completion_ids, mask, logprobs = rollout_fields(rollout, tokenizer)
        out["prompt_ids"].append(prompt_ids)
        out["completion_ids"].append(completion_ids)
        out["env_mask"].append(mask)
        out["logprobs"].append(logprobs)
        reward = rollout.reward
        scored = rollout.error is None and reward is not None and math.isfinite(reward)
        out[REWARD_KEY].append(float(reward) if scored and reward is not None else None)
        out[METRICS_KEY].append(dict(rollout.metrics))
    return out


def rollout_fields(rollout: Rollout, tokenizer: Any) -> tuple[list[int], list[int], list[int], list[float]]:
    """One rollout as (prompt ids, completion ids, env mask, logprobs).

    The completion is every reply's sampled tokens (mask 1, the sampler's logprobs) with what the
    environment and the template put between them (mask 0, logprob 0): the next turn's prompt ids
    after the reply. Where a reply's tokens are not how the tokenizer writes its text (a sampled
    token sequence the tokenizer would merge otherwise), the next prompt holds the re-tokenized
    reply; the reply's text is found there by decoding, and the sampled tokens stand in for it.
    A turn whose reply cannot be found so (a template that rewrites earlier turns) leaves only
    the last turn as the completion, with a warning. A rollout without a reply (it failed first)
    is its prompt and one masked EOS token, so the batch keeps its shape.
    """
    turns = [t for t in rollout.turns if t.token_ids != []]
    for turn in turns:
        if turn.token_ids is None or turn.prompt_token_ids is None or turn.logprobs is None:
            raise TokenError(
                f"rollout of example {rollout.example_id}: TRL needs each turn's prompt ids, completion ids "
                "and logprobs: use a client that returns them (LocalClient does; for vLLM send "
                "return_token_ids and logprobs)"
            )
    if not turns:
        return _prompt_ids(rollout, tokenizer), [int(tokenizer.eos_token_id)], [0], [0.0]
    first = turns[0]
    assert first.prompt_token_ids is not None
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for before, turn in zip([None, *turns[:-1]], turns, strict=True):
        assert turn.token_ids is not None and turn.logprobs is not None
        if before is not None:
            between = _between(rollout, before, turn, tokenizer)
            if between is None:
                log.warning(
                    "rollout of example %s: turn %d's prompt does not hold the previous reply as sampled "
                    "(the chat template rewrites earlier turns), so TRL trains the last turn only",
                    rollout.example_id,
                    turn.index,
                )
                last = turns[-1]
                assert last.prompt_token_ids is not None and last.token_ids is not None
                assert last.logprobs is not None
                return (
                    list(last.prompt_token_ids),
                    list(last.token_ids),
                    [1] * len(last.token_ids),
                    list(last.logprobs),
                )
            completion += between
            mask += [0] * len(between)
            logprobs += [0.0] * len(between)
        completion += turn.token_ids
        mask += [1] * len(turn.token_ids)
        logprobs += list(turn.logprobs)
    return list(first.prompt_token_ids), completion, mask, logprobs


def _between(rollout: Rollout, before: Turn, after: Turn, tokenizer: Any) -> list[int] | None:
    """The ids ``after``'s prompt adds past ``before``'s reply, or ``None`` if that reply is not there."""
    assert before.prompt_token_ids is not None and before.token_ids is not None
    assert after.prompt_token_ids is not None
    sampled = before.prompt_token_ids + before.token_ids
    ids = after.prompt_token_ids
    if ids[: len(sampled)] == sampled:
        return ids[len(sampled) :]
    prefix = len(before.prompt_token_ids)
    if ids[:prefix] != before.prompt_token_ids:
        return None
    messages = rollout.messages
    if before.prompt_messages >= len(messages):
        return None
    text = content_text(messages[before.prompt_messages].get("content"))
    for end in range(prefix, len(ids) + 1):  # the shortest run of ids that decodes to the reply
        decoded = tokenizer.decode(ids[prefix:end], skip_special_tokens=False)
        if decoded == text:
            break
        if len(decoded) > len(text):
            return None
    else:
        return None
    if end < len(ids) and before.token_ids[-1] == ids[end]:  # the end-of-turn token was sampled too
        end += 1
    return ids[end:]


def _prompt_ids(rollout: Rollout, tokenizer: Any) -> list[int]:
    for turn in rollout.turns:
        if turn.prompt_token_ids:
            return list(turn.prompt_token_ids)
    from palaestra import chat_template

    return chat_template.prompt_ids(tokenizer, rollout.prompt)

"""Tests for LocalClient's prefix reuse and continuous batching: same outputs, less prefill.

Replies are compared token for token; logprobs to 1e-5: a prefix taken from the cache (computed
one token at a time while decoding) and the same prefix recomputed in one prefill differ in the
last float32 bits, as a row alone and in a padded batch do. Against an independent forward pass
logprobs agree to 1e-4, as the other LocalClient tests check.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import palaestra as pa  # noqa: E402 - after the skips: these tests need torch and transformers
from palaestra.clients.local import LocalClient  # noqa: E402
from palaestra.clients.local_prefix import PrefixCache  # noqa: E402
from palaestra.clients.local_sampling import sample  # noqa: E402

SAMPLING = pa.Sampling(temperature=1.0, max_tokens=10)
EXACT = 1e-5  # cached vs recomputed states: last-bit differences only
REFERENCE = 1e-4  # against a separate forward pass, as in test_local_client.py


def load(model_dir: Path, context: int | None = None) -> tuple[object, object]:
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    if context is not None:  # rotary positions need no table: a longer context only lifts the check
        hf_model.config.max_position_embeddings = context
    return hf_model, transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def model(tiny_model_dir: Path) -> tuple[object, object]:
    return load(tiny_model_dir)


def client_of(model: tuple[object, object], **options: object) -> LocalClient:
    return LocalClient.from_model(*model, name="tiny", **options)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def forward_logprobs(client: LocalClient, reply: pa.ModelResponse) -> list[float]:
    """Logprobs (temperature 1, no filtering) of the reply's tokens from one forward pass."""
    ids = reply.prompt_token_ids + reply.token_ids
    with torch.no_grad():
        logits = client.hf_model(torch.tensor([ids])).logits[0, len(reply.prompt_token_ids) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(reply.token_ids)[:, None]).squeeze(1).tolist()


def assert_same(a: pa.ModelResponse, b: pa.ModelResponse) -> None:
    assert (a.content, a.token_ids, a.prompt_token_ids) == (b.content, b.token_ids, b.prompt_token_ids)
    assert a.logprobs == pytest.approx(b.logprobs, abs=EXACT)


async def three_turns(client: LocalClient, seed: int) -> list[pa.ModelResponse]:
    messages, replies = user("the cat sat on the mat."), []
    for turn, text in enumerate(["a dog ran.", "two birds flew over the house."]):
        replies.append(await client.chat(messages, sampling=SAMPLING.replace(seed=seed + turn)))
        messages = [*messages, replies[-1].message, *user(text)]
    replies.append(await client.chat(messages, sampling=SAMPLING.replace(seed=seed + 2)))
    return replies


async def test_next_turns_prefill_only_new_tokens_and_reply_as_if_recomputed(model: tuple) -> None:
    cached, fresh = client_of(model), client_of(model, prefix_cache_bytes=0)
    with_cache, without = await three_turns(cached, 5), await three_turns(fresh, 5)
    for a, b in zip(with_cache, without, strict=True):
        assert_same(a, b)
        assert a.logprobs == pytest.approx(forward_logprobs(cached, a), abs=REFERENCE)
    prompts = [len(r.prompt_token_ids) for r in with_cache]
    assert fresh.stats.prompt_tokens_computed == fresh.stats.prompt_tokens == sum(prompts)
    assert cached.stats.prompt_tokens == sum(prompts) and cached.stats.cache_hits == 2
    # turns 2 and 3 computed no more than what their prompt adds to the previous one
    assert cached.stats.prompt_tokens_computed <= prompts[0] + (prompts[1] - prompts[0]) + (
        prompts[2] - prompts[1]
    )
    assert cached.stats.prompt_tokens_computed < 0.6 * sum(prompts)


async def test_a_request_joining_a_busy_batch_mid_decode_replies_as_alone(model: tuple) -> None:
    alone_client, busy = client_of(model, prefix_cache_bytes=0), client_of(model)
    target = user("two small red birds sat under the big tree.")
    alone = await alone_client.chat(target, sampling=SAMPLING.replace(seed=11, max_tokens=24))
    long = SAMPLING.replace(max_tokens=60)
    others = [
        asyncio.create_task(busy.chat(user(f"{w} ran."), sampling=long.replace(seed=i)))
        for i, w in enumerate(["the cat", "a dog", "one bird", "the red house"])
    ]
    while busy.stats.steps < 5:  # the other rows are decoding
        await asyncio.sleep(0.001)
    batches = busy.stats.batches
    joined = await busy.chat(target, sampling=SAMPLING.replace(seed=11, max_tokens=24))
    assert busy.stats.batches == batches and not any(t.done() for t in others)  # joined the running batch
    await asyncio.gather(*others)
    assert busy.stats.largest_batch == 5
    assert_same(joined, alone)
    assert joined.logprobs == pytest.approx(forward_logprobs(busy, joined), abs=REFERENCE)


async def test_the_rollouts_of_a_group_share_their_prompt(model: tuple) -> None:
    client = client_of(model)
    prompt = user("the big dog sat on the small red mat.")
    replies = await asyncio.gather(
        *(client.chat(prompt, sampling=SAMPLING.replace(seed=s, max_tokens=16)) for s in (1, 2, 1, 3))
    )
    length = len(replies[0].prompt_token_ids)
    assert client.stats.prompt_tokens == 4 * length
    assert client.stats.prompt_tokens_computed == length  # computed once, then shared with its logits
    assert client.stats.cache_hits == 3
    assert replies[0].token_ids == replies[2].token_ids != replies[1].token_ids  # seeds still rule
    alone = await client_of(model, prefix_cache_bytes=0).chat(
        prompt, sampling=SAMPLING.replace(seed=2, max_tokens=16)
    )
    assert_same(replies[1], alone)


async def test_changed_weights_drop_every_cached_prefix(model: tuple) -> None:
    client = client_of(model)
    first = await three_turns(client, 7)
    assert client.stats.cache_entries > 0 and client.stats.cache_bytes > 0
    weight = client.hf_model.model.layers[0].self_attn.k_proj.weight  # changes every cached key
    async with client.paused():
        with torch.no_grad():
            weight.add_(torch.randn_like(weight))
    assert (client.stats.cache_entries, client.stats.cache_bytes) == (0, 0)
    before = client.stats.prompt_tokens_computed
    again = await client.chat(user("the cat sat on the mat."), sampling=SAMPLING.replace(seed=7))
    assert client.stats.prompt_tokens_computed - before == len(again.prompt_token_ids)  # nothing reused
    reference = await client_of(model, prefix_cache_bytes=0).chat(
        user("the cat sat on the mat."), sampling=SAMPLING.replace(seed=7)
    )
    assert_same(again, reference)
    assert again.logprobs != pytest.approx(first[0].logprobs, abs=1e-3)  # the new weights answered
    await client.update_weights({"model.layers.0.self_attn.k_proj.weight": weight.detach() * 0.5})
    assert client.stats.cache_entries == 0


async def test_memory_stays_within_the_budget_over_many_games(model: tuple) -> None:
    budget = 384 * 1024  # ~10 conversations of the tiny model (512 bytes of states per token)
    client = client_of(model, prefix_cache_bytes=budget)
    gate, peak = asyncio.Semaphore(8), 0

    def held() -> int:  # measured on the tensors themselves, not taken from the counter
        prefix = client._engine.prefix
        assert prefix is not None
        return sum(entry.nbytes for entry in list(prefix._entries.values()))

    async def game(i: int) -> None:
        nonlocal peak
        messages = user(f"game {i}: the cat sat.")
        async with gate:
            for turn in range(3):
                reply = await client.chat(
                    messages, sampling=pa.Sampling(temperature=1.0, max_tokens=3, seed=i)
                )
                messages = [*messages, reply.message, *user(f"move {turn}.")]
                peak = max(peak, held(), client.stats.cache_bytes)

    await asyncio.gather(*(game(i) for i in range(500)))
    stats = client.stats
    assert stats.requests == 1500 and 0 < peak <= budget and held() == stats.cache_bytes <= budget
    assert stats.cache_evictions > 100 and stats.cache_hits > 900  # evicted, yet later turns reused
    assert stats.prompt_tokens_computed < 0.6 * stats.prompt_tokens


async def run_tictactoe(client: LocalClient) -> list[pa.Rollout]:
    """The one place that calls ``env.run`` (its signature is changing)."""
    env = pa.load_environment("tictactoe", num_examples=8, opponent="random")
    sampling = pa.Sampling(temperature=1.0, max_tokens=12)
    spec = pa.RunSpec(num_examples=8, rollouts_per_example=2, max_concurrent=16, seed=0, sampling=sampling)
    return await env.run(client, spec)


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "sliding_model_dir"])
async def test_tictactoe_rollouts_are_the_same_with_prefix_reuse_on_and_off(
    model_dir: str, request: pytest.FixtureRequest
) -> None:
    model = load(
        request.getfixturevalue(model_dir), context=4096
    )  # the tiny tokenizer makes the rules ~700 tokens
    on, off = client_of(model), client_of(model, prefix_cache_bytes=0)
    with_reuse, without = await run_tictactoe(on), await run_tictactoe(off)
    assert len(with_reuse) == 16 and all(r.error is None for r in with_reuse)
    assert sum(len(r.turns) for r in with_reuse) > 32  # multi-turn: invalid moves do not end a game
    for a, b in zip(with_reuse, without, strict=True):
        assert a.messages == b.messages
        assert [t.prompt_token_ids for t in a.turns] == [t.prompt_token_ids for t in b.turns]
        assert [t.token_ids for t in a.turns] == [t.token_ids for t in b.turns]
        for x, y in zip(a.turns, b.turns, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=EXACT)
    assert off.stats.prompt_tokens_computed == off.stats.prompt_tokens == on.stats.prompt_tokens
    assert on.stats.prompt_tokens_computed < 0.3 * on.stats.prompt_tokens


def test_prefix_cache_matches_longest_prefix_supersedes_and_evicts() -> None:
    def states(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]  # 16 bytes per token

    cache = PrefixCache(budget=16 * 10)
    cache.add([1, 2, 3], states(3), {3: torch.zeros(2)})
    assert (
        cache.match([1, 2, 3])[1] == 3 and cache.match([1, 2, 9, 9])[1] == 2 and cache.match([7])[0] is None
    )
    cache.add([1, 2, 3, 4, 5], states(5))  # the next turn: the shorter entry is dropped, its logits kept
    assert len(cache) == 1 and cache.nbytes == 16 * 5 + 8
    entry, length = cache.match([1, 2, 3])
    assert length == 3 and entry is not None and 3 in entry.logits
    cache.add([1, 2], states(2), {2: torch.zeros(2)})  # a prefix of a held entry: only its logits stay
    assert len(cache) == 1 and 2 in entry.logits
    cache.add([8, 9, 9, 9, 9], states(5))  # over the budget: the least recently used entry goes
    assert len(cache) == 1 and cache.evictions == 1 and cache.match([1, 2])[0] is None
    cache.add([5] * 20, states(20))  # larger than the whole budget: not kept
    assert cache.match([5])[1] == 0 and cache.nbytes <= cache.budget
    cache.clear()
    assert (len(cache), cache.nbytes) == (0, 0)


def test_sampling_follows_the_filtered_distribution_row_by_row() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -9.0]] * 3)
    params = torch.tensor([[1.0, 1.0, 0.0], [0.5, 1.0, 2.0], [1.0, 0.8, 0.0]])  # (temperature, top_p, top_k)
    probs = [logits[0].softmax(-1), (logits[0, :2] / 0.5).softmax(-1), logits[0, :3].softmax(-1)]
    probs[2] = probs[2] / probs[2].sum()  # top-p 0.8 keeps 3 tokens (0.55 + 0.20 < 0.8), renormalised
    counts = torch.zeros(3, 6)
    for seed in range(6000):
        generators = [torch.Generator().manual_seed(seed * 3 + i) for i in range(3)]
        tokens, logprobs = sample(logits, params, generators)
        counts[torch.arange(3), tokens] += 1
        for row in range(3):
            assert logprobs[row].exp() == pytest.approx(probs[row][tokens[row]].item(), abs=1e-5)
    for row, p in enumerate(probs):
        assert (counts[row, : len(p)] / 6000).tolist() == pytest.approx(p.tolist(), abs=0.02)
        assert counts[row, len(p) :].sum() == 0  # filtered tokens are never drawn


def test_the_running_batch_keeps_each_rows_states_through_growth_and_removal() -> None:
    from palaestra.clients.local_batch import SLACK, RowBatch

    batch = RowBatch(torch.device("cpu"), torch.float32, max_rows=64)
    rows: dict[int, list[torch.Tensor]] = {}

    def states(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        return [(torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g)) for _ in range(3)]

    for request, length in enumerate([5, 40, 3, 300, 7, 12, 9, 2, 30, 18]):  # > 8 rows, a long joiner
        rows[request] = [t for pair in states(length, request) for t in pair]
        batch.add(request, states(length, request))
    for _ in range(2 * SLACK + 50):  # past the right slack: the buffers are reallocated while decoding
        mask, positions = batch.step_inputs()
        assert mask.shape == (batch.rows, batch.hi - batch.lo + 1) and mask[:, -1].all()
        assert positions[:, 0].tolist() == mask.sum(-1).sub(1).tolist()
        for layer in batch.cache.layers:
            new = torch.full((batch.rows, 2, 1, 4), float(batch.hi))
            layer.update(new, new)
        batch.advance()
    for request in (3, 0, 7):  # the longest row leaves: the used columns shrink
        batch.remove(batch.requests.index(request))
    assert batch.hi - batch.lo == 40 + 2 * SLACK + 50
    for row, request in enumerate(batch.requests):
        kept = [t for pair in batch.states(row) for t in pair]
        for before, now in zip(rows[request], kept, strict=True):
            prompt = before.shape[1]
            assert torch.equal(now[:, :prompt], before)  # its own states, moved and copied intact
            assert now[:, prompt:, 0].flatten().unique().numel() == 2 * SLACK + 50  # one column per step


def test_models_with_other_than_attention_layers_are_refused(model: tuple) -> None:
    hf_model, tokenizer = model
    hf_model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ValueError, match=r"attention-only.*linear_attention"):
        LocalClient.from_model(hf_model, tokenizer)

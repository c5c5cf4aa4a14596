"""Tests for LocalClient: batched generation, sampling, logprobs, seeds and weight updates.

The model is a tiny random Llama built from a config, with a byte-level BPE tokenizer trained here
on generated sentences and a ChatML chat template that takes tools; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import palaestra as pa

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import WORDS  # noqa: E402

from palaestra.clients.base import ModelError  # noqa: E402
from palaestra.clients.local import CPU_DTYPE, LocalClient, pick_dtype  # noqa: E402

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def model_dir(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


@pytest.fixture
def client(model_dir: Path) -> LocalClient:
    return LocalClient(model_dir, device="cpu", dtype="float32", name="tiny")


def greedy(max_tokens: int = 8, stop: list[str] | None = None) -> pa.Sampling:
    return pa.Sampling(temperature=0.0, max_tokens=max_tokens, stop=stop)


async def test_reply_carries_text_finish_reason_usage_tokens_and_logprobs(client: LocalClient) -> None:
    messages = user("the cat sat on the mat.")
    reply = await client.chat(messages, sampling=greedy(6))
    prompt = client.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert reply.finish_reason == "length"
    assert reply.message["role"] == "assistant"
    assert reply.content == client.tokenizer.decode(reply.token_ids, skip_special_tokens=True)
    assert len(reply.token_ids) == len(reply.logprobs) == 6
    assert all(lp <= 0 for lp in reply.logprobs)
    assert reply.usage == pa.Usage(prompt_tokens=len(prompt), completion_tokens=6)
    assert (client.model, client.device.type, client.dtype) == ("tiny", "cpu", torch.float32)
    assert isinstance(client, pa.ModelClient)


async def test_eos_ends_the_reply_with_stop_and_is_kept_in_token_ids(model_dir: Path) -> None:
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    head = torch.nn.Linear(64, hf_model.config.vocab_size, bias=True)
    head.weight.data.copy_(hf_model.lm_head.weight.data)
    head.bias.data.zero_()
    head.bias.data[tokenizer.eos_token_id] = 100.0  # always ends at once
    hf_model.lm_head = head
    client = LocalClient.from_model(hf_model, tokenizer, name="eager-eos")
    reply = await client.chat(user("two birds."), sampling=pa.Sampling(max_tokens=20, seed=1))
    assert (reply.content, reply.finish_reason, reply.token_ids) == ("", "stop", [tokenizer.eos_token_id])


async def test_concurrent_greedy_chats_are_batched_and_equal_sequential_ones(client: LocalClient) -> None:
    prompts = [
        "the cat.",
        "a big red dog ran under the tree.",
        "one.",
        "two small birds flew over the house.",
    ]
    lengths = [3, 9, 5, 12]  # rows finish at different steps and are dropped from the batch
    alone = [await client.chat(user(p), sampling=greedy(n)) for p, n in zip(prompts, lengths, strict=True)]
    before = (client.stats.batches, client.stats.steps, client.stats.tokens)
    together = await asyncio.gather(
        *(client.chat(user(p), sampling=greedy(n)) for p, n in zip(prompts, lengths, strict=True))
    )
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.content for r in together] == [r.content for r in alone]
    assert [len(r.token_ids) for r in together] == lengths
    assert client.stats.batches - before[0] == 1 and client.stats.largest_batch == 4
    assert client.stats.steps - before[1] == max(lengths)  # one forward pass per step for all rows
    assert client.stats.tokens - before[2] == sum(lengths)  # finished rows stopped costing compute


async def test_stop_strings_cut_the_text_and_finish_with_stop(client: LocalClient) -> None:
    full = await client.chat(user("a dog."), sampling=greedy(16))
    stop = next(
        full.content[i : i + 2] for i in range(2, len(full.content)) if full.content[i : i + 2].strip()
    )
    cut = await client.chat(user("a dog."), sampling=greedy(16, stop=[stop, "never-seen"]))
    assert cut.finish_reason == "stop"
    assert cut.content == full.content[: full.content.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]  # the stop string's tokens are kept
    assert (
        await client.chat(user("a dog."), sampling=greedy(16, stop=["never-seen"]))
    ).finish_reason == "length"


def reference_logprobs(
    client: LocalClient, messages: list, ids: list[int], sampling: pa.Sampling
) -> list[float]:
    """Logprobs of ``ids`` from one forward pass, processed by transformers' own logits warpers."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    prompt = client.tokenizer(client.render(messages), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = client.hf_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    warpers = [TemperatureLogitsWarper(sampling.temperature), TopKLogitsWarper(sampling.extra["top_k"])]
    warpers.append(TopPLogitsWarper(sampling.top_p))
    for warp in warpers:
        logits = warp(None, logits)
    return logits.log_softmax(-1).gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()


async def test_logprobs_are_those_of_the_processed_sampling_distribution(client: LocalClient) -> None:
    sampling = pa.Sampling(temperature=0.7, top_p=0.9, max_tokens=12, extra={"top_k": 20})
    conversations = [user("the cat."), user("a big blue bird flew over two small houses."), user("red.")]
    replies = await asyncio.gather(
        *(client.chat(m, sampling=sampling.replace(seed=i)) for i, m in enumerate(conversations))
    )
    for messages, reply in zip(conversations, replies, strict=True):
        expected = reference_logprobs(client, messages, reply.token_ids, sampling)
        assert reply.logprobs == pytest.approx(expected, abs=1e-4)
    greedy_reply = await client.chat(conversations[0], sampling=greedy(5))
    prompt = client.tokenizer(client.render(conversations[0]), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = client.hf_model(torch.tensor([prompt + greedy_reply.token_ids])).logits[
            0, len(prompt) - 1 : -1
        ]
    raw = logits.log_softmax(-1).gather(1, torch.tensor(greedy_reply.token_ids)[:, None]).squeeze(1)
    assert greedy_reply.logprobs == pytest.approx(raw.tolist(), abs=1e-4)  # greedy: the model's own


async def test_a_seeded_sample_does_not_depend_on_its_batch(client: LocalClient) -> None:
    sampling = pa.Sampling(temperature=1.0, max_tokens=16)
    target = (user("the dog ran."), sampling.replace(seed=7))
    alone = await client.chat(target[0], sampling=target[1])
    again = await client.chat(target[0], sampling=target[1])
    others = [
        (user("two big red birds flew over the small blue house."), sampling.replace(seed=8)),
        (user("a."), sampling.replace(seed=9, max_tokens=3)),
        (user("the dog ran."), sampling.replace(seed=10)),
    ]
    batch = await asyncio.gather(*(client.chat(m, sampling=s) for m, s in [others[0], target, *others[1:]]))
    assert alone.token_ids == again.token_ids == batch[1].token_ids
    assert batch[3].token_ids != alone.token_ids  # same prompt, another seed
    assert client.stats.largest_batch == 4


async def test_tools_are_rendered_by_a_template_that_takes_them(client: LocalClient) -> None:
    assert "get_weather" in client.render(user("weather?"), tools=[TOOL])
    plain = await client.chat(user("weather?"), sampling=greedy(2))
    with_tools = await client.chat(user("weather?"), tools=[TOOL], sampling=greedy(2))
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens
    client.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="does not take tools"):
        await client.chat(user("weather?"), tools=[TOOL], sampling=greedy(2))


def test_tool_call_history_reaches_the_template_as_objects(client: LocalClient) -> None:
    client.tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['content'] }}]{% for c in m.get('tool_calls') or [] %}"
        "{{ c['function']['arguments']['city'] }}{% endfor %}{% endfor %}"
    )
    call = {
        "id": "1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    history = [*user("weather?"), {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert client.render(history) == "[weather?][]Oslo"
    assert call["function"]["arguments"] == '{"city": "Oslo"}'  # the caller's messages are not changed


async def test_update_weights_waits_for_the_batch_in_flight_then_changes_replies(client: LocalClient) -> None:
    sampling = greedy(200)
    before = await client.chat(user("the cat."), sampling=sampling)
    in_flight = asyncio.create_task(client.chat(user("the cat."), sampling=sampling))
    steps = client.stats.steps
    while client.stats.steps == steps:
        await asyncio.sleep(0.001)
    new_head = torch.randn_like(client.hf_model.lm_head.weight)
    await client.update_weights({"lm_head.weight": new_head})
    assert in_flight.done() and (await in_flight).token_ids == before.token_ids
    assert torch.equal(client.hf_model.lm_head.weight, new_head)
    after = await client.chat(user("the cat."), sampling=sampling)
    assert after.token_ids != before.token_ids
    with pytest.raises(KeyError, match="not in the model"):
        await client.update_weights({"lm_head.weight": new_head * 0, "no.such.weight": new_head})
    assert torch.equal(client.hf_model.lm_head.weight, new_head)  # nothing copied from a bad state dict


async def test_the_event_loop_runs_while_a_batch_generates(client: LocalClient) -> None:
    task = asyncio.create_task(client.chat(user("the cat."), sampling=greedy(200)))
    ticks = 0
    while not task.done():
        await asyncio.sleep(0.001)
        ticks += 1
    assert client.stats.steps >= 150 and ticks >= 20


async def test_single_turn_env_runs_end_to_end_and_reproducibly(client: LocalClient) -> None:
    def length(completion: list) -> float:
        return float(len(completion[-1]["content"]))

    env = pa.SingleTurnEnv(
        dataset=[{"question": " ".join(WORDS[i : i + 3]), "answer": ""} for i in range(4)],
        rubric=pa.Rubric([length]),
        sampling=pa.Sampling(temperature=1.0, max_tokens=6),
    )
    first = await env.run(client, pa.RunSpec(rollouts_per_example=2, max_concurrent=8, seed=3))
    second = await env.run(client, pa.RunSpec(rollouts_per_example=2, max_concurrent=8, seed=3))
    assert len(first) == 8 and all(r.error is None and r.stop_reason == "answered" for r in first)
    assert all(r.turns[0].token_ids and len(r.turns[0].logprobs) == len(r.turns[0].token_ids) for r in first)
    assert [r.completion for r in first] == [r.completion for r in second]
    assert client.stats.largest_batch == 8


async def test_bad_requests_get_clear_errors_and_fail_alone(client: LocalClient) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        await client.chat([], sampling=greedy())
    with pytest.raises(ValueError, match="max_tokens"):
        await client.chat(user("a"), sampling=greedy(0))
    with pytest.raises(ValueError, match="temperature"):
        await client.chat(user("a"), sampling=pa.Sampling(temperature=-1))
    with pytest.raises(ValueError, match="min_p"):
        await client.chat(user("a"), sampling=pa.Sampling(extra={"min_p": 0.1}))
    too_long, fine = await asyncio.gather(
        client.chat(user("the cat sat. " * 100), sampling=greedy()),
        client.chat(user("the cat sat."), sampling=greedy()),
        return_exceptions=True,
    )
    assert isinstance(too_long, ValueError) and "at most 256" in str(too_long)
    assert isinstance(fine, pa.ModelResponse) and len(fine.token_ids) == 8


async def test_an_error_in_generation_fails_its_batch_only_and_closing_ends_the_client(
    client: LocalClient,
) -> None:
    forward = client.hf_model.forward

    def broken(*args: object, **kwargs: object) -> object:
        client.hf_model.forward = forward  # fails once
        raise RuntimeError("boom")

    client.hf_model.forward = broken
    results = await asyncio.gather(
        *(client.chat(user(f"{w}."), sampling=greedy()) for w in WORDS[:3]), return_exceptions=True
    )
    assert all(isinstance(r, ModelError) and "RuntimeError: boom" in str(r) for r in results)
    assert len((await client.chat(user("the cat."), sampling=greedy())).token_ids) == 8
    async with client:
        pass
    with pytest.raises(ModelError, match="closed"):
        await client.chat(user("the cat."), sampling=greedy())


async def test_a_cancelled_request_stops_generating(client: LocalClient) -> None:
    task = asyncio.create_task(client.chat(user("the cat."), sampling=greedy(200)))
    while client.stats.steps < 3:
        await asyncio.sleep(0.001)
    task.cancel()
    after = await client.chat(user("the cat."), sampling=greedy(4))  # runs once the cancelled batch ends
    assert len(after.token_ids) == 4
    assert client.stats.tokens < 50  # not the 200 the cancelled request asked for


async def test_device_and_dtype_are_chosen_and_overridable(model_dir: Path) -> None:
    bf16 = LocalClient(model_dir, device="cpu", dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16 and bf16.hf_model.dtype == torch.bfloat16
    assert (await bf16.chat(user("the cat."), sampling=greedy(3))).finish_reason == "length"
    assert LocalClient(model_dir).device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_dtype("auto", torch.device("cpu")) == getattr(torch, CPU_DTYPE)
    with pytest.raises(ValueError, match="dtype must be"):
        LocalClient(model_dir, dtype="float64")  # type: ignore[arg-type]  # a bad value on purpose


def test_importing_the_client_does_not_import_torch() -> None:
    code = "import sys, palaestra.clients.local; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_a_prompt_far_beyond_the_context_is_refused_before_it_is_tokenised(model_dir: Path) -> None:
    client = LocalClient(model_dir, name="tiny")
    try:
        huge = user("cat " * 2_000_000)  # 8 MB of text; the tiny model takes 256 tokens
        with pytest.raises(ValueError, match="far more than the 256 tokens"):
            await client.chat(huge, sampling=greedy(2))
        assert client.stats.requests == 0  # refused on the event loop: never reached the tokenizer
        assert (await client.chat(user("the cat."), sampling=greedy(2))).finish_reason == "length"
    finally:
        await client.aclose()


async def test_a_lora_model_is_given_the_cache_by_its_base_models_argument(model_dir: Path) -> None:
    """A PEFT model's forward takes ``**kwargs``: the client reads the argument names of the model
    under it, so the cache goes by the name that model takes (no deprecated-argument warning), and
    greedy replies are the plain model's (a fresh adapter changes nothing)."""
    import warnings

    from palaestra.train.model import add_lora
    from palaestra.train.sft_config import LoraConfig

    plain = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    wrapped = add_lora(
        transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        LoraConfig(enabled=True, rank=4, target_modules=("q_proj", "v_proj")),
    )
    lora = LocalClient.from_model(wrapped, tokenizer, name="lora")
    base = LocalClient.from_model(plain, tokenizer, name="plain")
    assert lora.forward_args == base.forward_args
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replies = [await c.chat(user("the cat sat on the mat."), sampling=greedy(8)) for c in (lora, base)]
    assert replies[0].token_ids == replies[1].token_ids
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
    await lora.aclose()
    await base.aclose()

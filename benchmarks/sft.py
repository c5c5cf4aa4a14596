"""SFT speed: palaestra's trainer against TRL's ``SFTTrainer`` on the same data, model and batches.

    ~/venvs/trl/bin/python benchmarks/sft.py --data DATASET_DIR --model tiny --steps 30
    ~/venvs/trl/bin/python benchmarks/sft.py --data DATASET_DIR --model smollm2 --steps 5 --micro-tokens 1024 --trl-micro 1

Needs a venv with TRL and this palaestra (TRL is a benchmark-only dependency): see
benchmarks/README.md. Each trainer runs in its own child process, one after the other (``--rounds``
times, alternating), so its peak memory (max RSS) is its own. Both get exactly the same thing:

- **data**: palaestra's tokenisation of the dataset (chat template, assistant-only labels), handed
  to TRL as ``input_ids`` + ``labels``; for the tiny model a tokenizer trained on the data, built once;
- **model**: the same folder (SmolLM2, or the tiny model built once), float32, CPU;
- **batches**: palaestra's seeded order, fed to TRL in that order with a sequential sampler, so step
  k trains on the same conversations in both, and the losses can be compared step by step;
- **optimizer**: AdamW (betas 0.9/0.95, eps 1e-8, no weight decay), constant lr, clip 1.0, loss =
  mean cross-entropy over the step's trained tokens (TRL divides by ``num_items_in_batch``).

Reported per trainer: trained tokens/s over the timed steps (step 1, a warm-up, is left out), peak
RSS, and the losses. The throughput ratio counts only if the losses agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LR = 1e-4
BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a rollouts dataset folder (e.g. from --save-dataset)")
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--micro-tokens", type=int, default=4096, help="palaestra's micro_batch_tokens")
    parser.add_argument("--trl-micro", type=int, default=8, help="TRL's per_device_train_batch_size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--trainers", default="palaestra,trl", help="comma-separated: palaestra, trl, noshare"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    work = Path(tempfile.mkdtemp(prefix="sft-bench-"))
    model_dir = prepare_model(args, work)
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for trainer in args.trainers.split(","):
            results.append(run_child(args, trainer, model_dir, work / f"{trainer}-{round_}"))
            print(json.dumps(summary(results[-1])), flush=True)
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    report(results)


def prepare_model(args: argparse.Namespace, work: Path) -> str:
    """The model folder both trainers load: SmolLM2's, a given one, or a tiny model built once here."""
    if args.model != "tiny":
        from palaestra.clients.default_model import resolve_model

        return resolve_model(args.model)
    from palaestra.tiny_model import TinyConfig, build_tiny_model
    from palaestra.train.data import load_conversations, message_texts

    path = work / "tiny-model"
    sizes = TinyConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        max_positions=2048,
        initializer_range=0.02,
        tie_embeddings=True,
    )
    build_tiny_model(message_texts(load_conversations(args.data)), sizes, path=path)
    return str(path)


def run_child(args: argparse.Namespace, trainer: str, model_dir: str, out: Path) -> dict[str, Any]:
    """Run one trainer in a child process; its result plus its own peak RSS."""
    command = [sys.executable, __file__, "--worker", trainer, "--work", str(out), "--model", model_dir]
    command += ["--data", args.data, "--steps", str(args.steps), "--max-length", str(args.max_length)]
    command += ["--micro-tokens", str(args.micro_tokens), "--trl-micro", str(args.trl_micro)]
    command += ["--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    out.mkdir(parents=True, exist_ok=True)
    with (out / "result.json").open("w") as result_file:
        child = subprocess.Popen(command, env=env, stdout=result_file)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage: its peak RSS
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{trainer} failed (exit {child.returncode})")
    result = json.loads((out / "result.json").read_text().strip().splitlines()[-1])
    result["peak_rss_gb"] = usage.ru_maxrss / 1e6  # KiB on Linux
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    timed = result["steps"][1:]
    seconds = sum(s["seconds"] for s in timed)
    return {
        "trainer": result["trainer"],
        "trained_tokens_per_s": round(sum(s["trained_tokens"] for s in timed) / seconds, 1),
        "tokens_per_s": round(sum(s["tokens"] for s in timed) / seconds, 1),
        "s_per_step": round(seconds / len(timed), 2),
        "peak_rss_gb": round(result["peak_rss_gb"], 2),
        "final_loss": round(sum(s["loss"] for s in result["steps"][-3:]) / 3, 4),
        "losses": [round(s["loss"], 4) for s in result["steps"]],
    }


def report(results: list[dict[str, Any]]) -> None:
    rows = [summary(r) for r in results]
    best = {}
    for row in rows:
        name = row["trainer"]
        if name not in best or row["trained_tokens_per_s"] > best[name]["trained_tokens_per_s"]:
            best[name] = row
    print("\n| trainer | trained tok/s | all tok/s | s/step | peak RSS GB | loss, last 3 steps |")
    print("|---|---|---|---|---|---|")
    for row in best.values():
        print(
            f"| {row['trainer']} | {row['trained_tokens_per_s']} | {row['tokens_per_s']} | {row['s_per_step']} "
            f"| {row['peak_rss_gb']} | {row['final_loss']} |"
        )
    if "palaestra" in best and "trl" in best:
        ratio = best["palaestra"]["trained_tokens_per_s"] / best["trl"]["trained_tokens_per_s"]
        gap = max(abs(a - b) for a, b in zip(best["palaestra"]["losses"], best["trl"]["losses"], strict=True))
        print(
            f"\npalaestra / TRL trained tokens/s: {ratio:.2f}x; largest per-step loss difference: {gap:.4f}"
        )


# -- the workers (child processes) ---------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.work)
    steps = (
        run_palaestra(args, out, share=args.worker != "noshare")
        if args.worker != "trl"
        else run_trl(args, out)
    )
    print(json.dumps({"trainer": args.worker, "steps": steps}))


def palaestra_config(args: argparse.Namespace, out: Path, *, share: bool = True) -> Any:
    from palaestra.train import sft_config as c

    return c.SFTConfig(
        data=c.DataConfig(path=args.data, max_length=args.max_length),
        model=c.ModelConfig(path=args.model),
        optim=c.OptimConfig(lr=LR, schedule="constant", warmup_steps=0, betas=(0.9, 0.95), max_grad_norm=1.0),
        train=c.TrainConfig(
            steps=args.steps,
            batch_size=BATCH,
            micro_batch_tokens=args.micro_tokens,
            share_prefix=share,
            threads=args.threads,
            seed=0,
        ),
        output=c.OutputConfig(dir=str(out)),
    )


def run_palaestra(args: argparse.Namespace, out: Path, *, share: bool) -> list[dict[str, Any]]:
    from palaestra.train.metrics import read_metrics
    from palaestra.train.sft import train_sft

    train_sft(palaestra_config(args, out / "run", share=share), progress=False)
    return [
        {
            "loss": r["loss"],
            "seconds": r["seconds"],
            "tokens": r["tokens"],
            "trained_tokens": r["trained_tokens"],
        }
        for r in read_metrics(out / "run" / "metrics.jsonl")
    ]


def run_trl(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from palaestra.train.batching import step_indices
    from palaestra.train.data import load_chats
    from palaestra.train.sft import encode_all
    from palaestra.train.tokenize import IGNORE, end_of_turn_ids

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = palaestra_config(args, out)
    examples = encode_all(tokenizer, load_chats(args.data), config, end_of_turn_ids(tokenizer))
    order = [i for step in range(args.steps) for i in step_indices(len(examples), BATCH, 0, step)]
    rows = [{"input_ids": examples[i].input_ids, "labels": examples[i].labels} for i in order]
    dataset = datasets.Dataset.from_list(rows)
    steps: list[dict[str, Any]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            batch = rows[len(steps) * BATCH : (len(steps) + 1) * BATCH]
            steps.append(
                {
                    "seconds": time.perf_counter() - self.t0,
                    "tokens": sum(len(r["input_ids"]) for r in batch),
                    "trained_tokens": sum(label != IGNORE for r in batch for label in r["labels"]),
                }
            )

        def on_log(self, _args: Any, state: Any, control: Any, logs: Any = None, **k: Any) -> None:
            if logs and "loss" in logs and steps:
                steps[-1]["loss"] = logs["loss"]

    assert BATCH % args.trl_micro == 0
    trl_config = SFTConfig(
        output_dir=str(out / "run"),
        max_steps=args.steps,
        per_device_train_batch_size=args.trl_micro,
        gradient_accumulation_steps=BATCH // args.trl_micro,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        max_length=args.max_length,
        train_sampling_strategy="sequential",
        dataloader_num_workers=0,
        seed=0,
        logging_nan_inf_filter=False,
        disable_tqdm=True,
        gradient_checkpointing=False,  # TRL defaults to True: recomputing the forward pass is not the same work
    )
    trainer = SFTTrainer(
        model=model,
        args=trl_config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    return steps


if __name__ == "__main__":
    main()

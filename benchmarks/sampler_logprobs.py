"""Whether a sampler generated with the weights it was meant to: the logprobs it returned for the
tokens it sampled, against the logprobs of the same tokens under each model given.

    .venv/bin/python benchmarks/sampler_logprobs.py RUN/samples/step-000002 RUN/checkpoints/step-000001 MODEL_BEFORE

An RL run saves each step's rollouts (``output.sample_every``) with every turn's prompt and
completion token ids and the sampler's per-token logprobs. The rollouts of step 2 were sampled
after step 1's weights were pushed to the sampler: if the push worked, the sampler's logprobs
match step 1's checkpoint (to the sampler's numerical noise) and differ from the weights before
the update by about as much as the update moved them. Both numbers are printed, so the check
shows its own sensitivity: a mismatch below the noise means nothing if the update moved the
logprobs less than that.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path, help="a run's samples/step-N folder (its results.jsonl)")
    parser.add_argument("models", nargs="+", help="model folders to score the sampled tokens with")
    parser.add_argument("--temperature", type=float, default=1.0, help="the run's sampling temperature")
    parser.add_argument("--turns", type=int, default=64, help="at most this many turns (the first ones)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    turns = []
    versions = set()
    for line in (args.samples / "results.jsonl").open():
        rollout = json.loads(line)
        versions.add(str(rollout.get("policy_version")))
        for turn in rollout.get("turns") or []:
            if turn.get("token_ids") and turn.get("logprobs") and turn.get("prompt_token_ids"):
                turns.append((turn["prompt_token_ids"], turn["token_ids"], turn["logprobs"]))
    if not turns:
        raise SystemExit(f"{args.samples}: no turns with token ids and logprobs")
    turns = turns[: args.turns]
    tokens = sum(len(t[1]) for t in turns)
    print(f"{args.samples}: {len(turns)} turns, {tokens} sampled tokens, policy versions {sorted(versions)}")
    for path in args.models:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        gaps: list[float] = []
        with torch.no_grad():
            for prompt, completion, sampled in turns:
                ids = torch.tensor([prompt + completion])
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / args.temperature
                logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
                gaps += (logp - torch.tensor(sampled)).abs().tolist()
        print(
            f"  {path}: |model - sampler| logprob per token: mean {statistics.fmean(gaps):.2e}, "
            f"median {statistics.median(gaps):.2e}, max {max(gaps):.2e}"
        )


if __name__ == "__main__":
    main()

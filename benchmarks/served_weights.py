"""The reload sync's write of a tied model (``save_served``) against writing it twice.

A remote sampler that reloads (``sync = "reload"``) writes the whole weights once per step. A tied
model (SmolLM2's output layer is its input embedding) must be written untied for vLLM's reload to
refill the output layer. ``save_served`` does that in the one ``save_pretrained`` call (a state
dict whose output layer has a storage of its own); the reference is the way it was done before:
``save_pretrained`` as transformers saves the model, then the file read back and written again
with the output layer in it. Rounds interleave the two; prints the median seconds of each and
their ratio.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/served_weights.py          # SmolLM2-135M, ~1 minute
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from palaestra.clients.default_model import resolve_model
from palaestra.train.samplers.sync import save_served


def written_twice(model: Any, folder: Path) -> None:
    """The reference: the checkpoint as transformers writes it, then rewritten with the output layer."""
    model.save_pretrained(str(folder))
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["lm_head.weight"] = model.lm_head.weight.detach().clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
    assert model.config.tie_word_embeddings, "the benchmark is about a tied model"
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    times: dict[str, list[float]] = {"save_served (one write)": [], "written twice (reference)": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name in times:
                folder = Path(tmp) / f"{round_}-{len(times[name])}-{name[:4]}"
                start = time.perf_counter()
                if name.startswith("save_served"):
                    save_served(model, None, folder, base=False)
                else:
                    written_twice(model, folder)
                times[name].append(time.perf_counter() - start)
    reference = statistics.median(times["written twice (reference)"])
    print(f"{args.model}: {size:.2f} GB of float32 weights, {args.rounds} rounds, median seconds")
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"  {name}: {median:.2f} s ({', '.join(f'{v:.2f}' for v in values)}); {median / reference:.2f}x"
        )


if __name__ == "__main__":
    main()

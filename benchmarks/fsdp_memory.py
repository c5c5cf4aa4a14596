"""Peak memory and step time per rank of ``train.fsdp``'s modes, on the CPU (gloo), 2 ranks:

    OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=65536 python -m torch.distributed.run --standalone \
        --nproc-per-node 2 benchmarks/fsdp_memory.py MODE      # MODE: off (data-parallel), fsdp (true), layers

A 19.2M-parameter random Llama (12 layers, hidden 384, MLP 1024, vocab 400, untied output
layer: nearly every parameter in a decoder layer), float32, AdamW; each step one micro-batch of
2 x 128 tokens per rank, the trainers' calls (the body and the output layer apart,
``palaestra.train.fsdp``'s gradient sum, clipping, the step, the gather). Each mode runs in its own
processes, so a rank's peak resident memory (``ru_maxrss``) is that mode's; it is reported above
the process's resident memory before the model was built (torch and gloo themselves), with the
mean time of the steps after the first. ``MALLOC_MMAP_THRESHOLD_`` keeps glibc returning a freed
tensor's memory at once (else it raises its threshold and keeps freed chunks: the resident peak
then reads high by the allocator's cache, not the tensors); the steps are slower with it.
"""

from __future__ import annotations

import resource
import sys
import time

import torch
import torch.nn.functional as F

from palaestra.train import fsdp
from palaestra.train.distributed import join, leave, world_from_env
from palaestra.train.model import backbone_and_head

MODES = {"off": False, "fsdp": True, "layers": "layers"}
STEPS = 5


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    mode = MODES[sys.argv[1]]
    torch.set_num_threads(1)
    world = world_from_env()
    device = join(world, torch.device("cpu"))
    before = resident_mb()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=400,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=12,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).train()
    count = sum(p.numel() for p in model.parameters())
    shards = fsdp.shard(model, world, device, mode)
    params = shards.params if shards else list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    backbone, head = backbone_and_head(model)
    rows = torch.Generator().manual_seed(world.rank)
    seconds = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        ids = torch.randint(0, config.vocab_size, (2, 128), generator=rows)
        most = shards.most(1) if shards else 1
        hidden = backbone(input_ids=ids, use_cache=False).last_hidden_state
        logits, targets = head(hidden[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()
        loss = F.cross_entropy(logits, targets, reduction="sum") / (targets.numel() * world.size)
        loss.backward()
        if shards:
            shards.pad(backbone, head, device, 0, most - 1)
        fsdp.sum_gradients(params, world, shards)
        fsdp.clip_gradients(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if shards:
            shards.gather()
        seconds.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    step_ms = 1000 * sum(seconds[1:]) / (STEPS - 1)
    print(
        f"{sys.argv[1]}: rank {world.rank}/{world.size}, {count / 1e6:.1f}M parameters: peak resident "
        f"{peak - before:.0f} MB above {before:.0f} MB, step {step_ms:.0f} ms",
        flush=True,
    )
    leave(world)


if __name__ == "__main__":
    main()

"""How new weights reach a remote sampler, through endpoints vLLM has (and ``palaestra serve`` mirrors).

- ``lora``: the adapter is saved as ``WEIGHTS_DIR/adapter-vN`` and loaded under a fresh name,
  ``POLICY-vN`` (``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``); requests then name
  that adapter as their model and the version before is unloaded (``POST
  /v1/unload_lora_adapter``). A fresh name per version because vLLM keys its prefix cache on the
  adapter: no state computed with older weights is reused. vLLM needs ``--enable-lora
  --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.
- ``reload``: the whole weights are written into the folder the server serves (each file replaced
  atomically, so a reader sees the old file or the new one, never half of one), then the server
  reloads them from there (``POST /collective_rpc {"method": "reload_weights"}``) and drops its
  prefix cache (``POST /reset_prefix_cache``). Exact: the server reads the very files a fresh start
  would. vLLM needs ``VLLM_SERVER_DEV_MODE=1`` and to serve that folder.

Why not vLLM's native weight transfer (``--weight-transfer-config``, NCCL or CUDA IPC, which TRL's
``VLLMClient`` drives; prime-rl broadcasts over NCCL or a shared filesystem): it needs CUDA on both
sides and vLLM in the trainer's environment; a reload works on any machine, at the cost of writing
and reading the weights once per step. It is the next mechanism to add for large models.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from palaestra.train.model import is_lora

LORA_HINT = (
    "start vLLM with --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
    "(palaestra serve: --enable-weight-sync)"
)
RELOAD_HINT = (
    "start vLLM with VLLM_SERVER_DEV_MODE=1 on sampler.weights_dir (palaestra serve: --enable-weight-sync)"
)


class SyncError(RuntimeError):
    """The sampler server did not take the new weights; the message is one line and says why."""


async def post(root: str, path: str, body: dict[str, Any], headers: dict[str, str], *, hint: str) -> None:
    """``POST root + path`` with a JSON body; ``SyncError`` unless it answers 2xx (404: ``hint``)."""
    url = root + path
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.post(
                url,
                data=orjson.dumps(body),
                headers={
                    "Content-Type": "application/json"
                },  # vLLM refuses its LoRA endpoints' bodies without
                timeout=aiohttp.ClientTimeout(total=600),
            ) as r:
                status, raw = r.status, await r.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SyncError(
            f"cannot reach the sampler server at {url}: {str(exc) or type(exc).__name__}"
        ) from None
    if status == 404:
        raise SyncError(f"the sampler server has no {path} or refused it (HTTP 404: {_message(raw)}): {hint}")
    if not 200 <= status < 300:
        raise SyncError(f"the sampler server refused {path} (HTTP {status}): {_message(raw)}")


def _message(raw: bytes) -> str:
    """The error message of an OpenAI-style or FastAPI-style error body, else its start."""
    try:
        data = orjson.loads(raw)
        error = data.get("error") or data.get("detail") or data.get("message") or data
        text = error.get("message", error) if isinstance(error, dict) else error
        return " ".join(str(text).split())[:300]
    except (orjson.JSONDecodeError, AttributeError):
        return raw[:300].decode(errors="replace")


def replace_files(source: Path, target: Path) -> None:
    """Move every file of ``source`` into ``target`` (each replaced atomically), then remove ``source``."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        os.replace(path, target / path.name)
    source.rmdir()


def save_served(
    model: Any, tokenizer: Any, folder: Path, *, base: bool, state: dict[str, Any] | None = None
) -> None:
    """The weights a server should serve, written into ``folder``: the model (a LoRA model merged
    into a copy), or with ``base`` its base model without the adapter; with the tokenizer. An
    output layer tied to the input embedding is written untied (``untied_state``), in the same
    single write. ``state``: the whole model's state dict, when the live model holds only shards
    of it (FSDP, ``Shards.full_weights``; never with LoRA, which FSDP refuses)."""
    if state is not None and is_lora(model):
        raise ValueError("save_served: a state dict is for a sharded model, and FSDP refuses LoRA")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    served = model
    if is_lora(model):
        served = copy.deepcopy(model).unload() if base else copy.deepcopy(model).merge_and_unload()
    untied = untied_state(served, state)
    state = untied if untied is not None else state
    served.save_pretrained(str(tmp), **({"state_dict": state} if state is not None else {}))
    if untied is not None:
        config_file = tmp / "config.json"
        config_file.write_text(
            json.dumps(json.loads(config_file.read_text()) | {"tie_word_embeddings": False}, indent=2)
        )
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    replace_files(tmp, folder)


def untied_state(model: Any, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The state dict of a tied model (``state``, its whole weights when the live model holds
    only shards of them; else the model's own) with its output layer as a weight of its own (a
    copy of the input embedding), to be saved with ``tie_word_embeddings: false``; ``None`` for a
    model whose output layer is not tied.

    A tied model (SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B: the output layer is the input embedding)
    is saved with the embedding only. vLLM's in-place ``reload_weights`` then refills the
    embedding but not the output layer (vLLM 0.32: "ParallelLMHead: Failed to load weights"), so
    after a sync it samples with the new body and the *old* output layer: measured on SmolLM2
    after one update, its logprobs were off the trainer's by 2e-3 per token on average (up to
    0.05), and matched the new body with the old output layer to 1e-6. Saved untied, the output
    layer is a checkpoint weight every load and reload reads; the values are the same."""
    config = getattr(model, "config", None)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inputs = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if (
        config is None
        or not getattr(config, "tie_word_embeddings", False)
        or output is None
        or inputs is None
        or output.weight.data_ptr() != inputs.weight.data_ptr()  # not tied after all
    ):
        return None
    name = next(n for n, m in model.named_modules() if m is output) + ".weight"
    source = next(n for n, m in model.named_modules() if m is inputs) + ".weight"
    state = dict(model.state_dict() if state is None else state)
    if name not in state or state[name].data_ptr() == state[source].data_ptr():
        state[name] = state[source].detach().clone()  # storage of its own: transformers keeps it
    return state


class LoraSync:
    """A LoRA adapter per policy version, loaded into the server under a fresh name."""

    kind = "lora"

    def __init__(self, root: str, headers: dict[str, str], weights_dir: Path, prefix: str) -> None:
        self.root, self.headers, self.weights_dir, self.prefix = root, headers, weights_dir, prefix
        self.loaded: tuple[str, Path] | None = None

    async def push(self, model: Any, version: int) -> str:
        """Save and load the adapter of ``version``; unload the one before. Returns the model name to ask."""
        name, path = f"{self.prefix}-v{version}", self.weights_dir / f"adapter-v{version}"
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))  # a peft model saves its adapter alone
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        body = {"lora_name": name, "lora_path": str(path.resolve())}
        await post(self.root, "/v1/load_lora_adapter", body, self.headers, hint=LORA_HINT)
        before, self.loaded = self.loaded, (name, path)
        if before is not None:
            await post(
                self.root, "/v1/unload_lora_adapter", {"lora_name": before[0]}, self.headers, hint=LORA_HINT
            )
            shutil.rmtree(before[1], ignore_errors=True)
        return name


class ReloadSync:
    """The whole weights, written where the server reads them, then reloaded by the server."""

    kind = "reload"

    def __init__(self, root: str, headers: dict[str, str], weights_dir: Path) -> None:
        self.root, self.headers, self.weights_dir = root, headers, weights_dir

    async def push(
        self, model: Any, version: int, *, written: bool = False, state: dict[str, Any] | None = None
    ) -> None:
        """Write the weights of ``version`` (unless ``written``; ``state``: the whole model's, of a
        sharded one) and have the server reload them."""
        if not written:
            save_served(model, None, self.weights_dir, base=False, state=state)
        await post(self.root, "/collective_rpc", {"method": "reload_weights"}, self.headers, hint=RELOAD_HINT)
        await post(self.root, "/reset_prefix_cache", {}, self.headers, hint=RELOAD_HINT)

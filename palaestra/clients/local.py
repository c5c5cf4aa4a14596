"""LocalClient: a Hugging Face causal LM in this process, with continuous batching and prefix reuse.

``chat()`` and ``chat_stream()`` queue a request; one worker thread owns the model and runs the
step loop of ``local_engine``, so the event loop never waits on the model. Requests join and
leave the running batch at every decoding step (``local_batch``), and a request whose prompt
extends an earlier prompt + reply (the next turn of a conversation) or repeats a prompt (the
rollouts of a group) reuses those KV states and prefills only the new tokens
(``local_prefix``: an LRU within ``prefix_cache_bytes``). Why not transformers' own continuous
batching (``generate_batch``/``init_continuous_batching``): in transformers 5.24 it has no
per-request seed (``add_request(seed=...)`` fails the request; sampling uses the global RNG, so a
row alone and the same row in a batch differ), and on CPU it was measured 1.8-3x slower per token
than a padded batch; see docs/local-models.md.

Sampling is per request: temperature (0 is greedy), then top-k (``sampling.extra["top_k"]``),
then top-p, as in transformers' ``generate``. Each sampled row draws its token with the
Gumbel-max trick from its own ``torch.Generator`` seeded by ``sampling.seed``, so a seeded
request samples the same noise whatever else shares its batch. The limit: logits of one prompt
differ in the last bits between batch shapes (padding, other rows) and between a prefix taken
from the cache and one recomputed, which flips a sample in a near-tie. In float32 no flip showed
(tests; SmolLM2 replies of 64 tokens equal alone and batched); in bfloat16 most replies flip
somewhere, so there a seed reproduces a reply only with the same batch. Unseeded requests get
fresh entropy.

Logprobs are those of the returned tokens under the distribution actually sampled from: the
log-softmax of the temperature-scaled logits after top-k/top-p filtering, renormalised. Greedy
rows (temperature 0) report the model's own log-softmax at temperature 1. ``token_ids`` are every
sampled token: the EOS token that ended a reply, and the tokens of a stop string, are included
(the text is cut before them).

Dtype: ``"auto"`` is bfloat16 on CUDA (float16 without bf16) and float32 on CPU. Measured with
SmolLM2-135M on a 2-core CPU (benchmarks/README.md): bf16 was 1.13x faster at 32 concurrent
requests and 1.46x at 64, but its logprobs were off from fp32 ones by 0.037 per token on average
(0.3 per 64-token reply; 3e-6 in fp32), and 25 of 32 seeded replies changed when batched with
others (none in fp32). On CPU, honest logprobs and reproducible seeds win; pass
``dtype="bfloat16"`` for evaluation-only throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from palaestra import chat_template, tool_calls
from palaestra.clients.base import ModelError
from palaestra.types import ChatChunk, Messages, ModelResponse, Sampling, content_text

if TYPE_CHECKING:
    import torch

    from palaestra.clients.local_engine import Engine, Request

DTypeName = Literal["auto", "bfloat16", "float16", "float32"]
CPU_DTYPE: DTypeName = "float32"  # why: see the module docstring
SAMPLING_EXTRA = ("top_k",)
MAX_CHARS_PER_TOKEN = 16  # no tokenizer packs more into a token on real text: a prompt beyond it cannot fit
PREFIX_CACHE_BYTES = 1 << 30  # default budget of cached prefixes: ~23k tokens of SmolLM2-135M in fp32


@dataclass
class LocalStats:
    """Counters of the generation loop (updated by the worker thread; read them any time)."""

    batches: int = 0  # how often the running batch started from empty (after ``batch_window``)
    requests: int = 0
    steps: int = 0  # scheduler steps; each gives every running request one token
    tokens: int = 0  # completion tokens generated
    largest_batch: int = 0  # the most requests running at once
    active: int = 0  # requests running now
    cancelled: int = 0  # requests whose caller went away before they ended
    prompt_tokens: int = 0  # prompt tokens sent: the sum of every request's prompt length
    prompt_tokens_computed: int = 0  # of which prefilled; the rest came from the prefix cache
    cache_hits: int = 0  # requests that reused a cached prefix
    cache_evictions: int = 0  # cached prefixes dropped to stay within the budget
    cache_bytes: int = 0  # bytes held by cached prefixes now
    cache_entries: int = 0
    malformed_tool_calls: int = 0  # ``<tool_call>`` attempts in replies to tool requests that were no call


class LocalClient:
    """Chat with a transformers causal LM loaded in this process; see the module docstring.

    ``model`` is a model directory, a hub id (where the hub is reachable), a ``.gguf`` file, or an
    alias of ``default_model.resolve_model`` (``"smollm2"``, the default). ``hf_model`` is the
    ``torch.nn.Module`` itself: a trainer may change its weights in place inside
    ``async with client.paused():`` or through ``update_weights``. ``prefix_cache_bytes`` bounds
    the KV states kept for reuse across requests (0 turns reuse off). ``chat_template`` (Jinja)
    replaces the tokenizer's own, e.g. to give tools to a model whose template has none; the
    default model gets SmolLM2's template with Hermes-style tools (``default_model.chat_template_for``).

    Tools: a request with ``tools`` needs a template that takes them (else ``ValueError``); its
    reply is parsed for Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks (``palaestra.tool_calls``): the message gets ``tool_calls`` and the content the text
    around them (stripped), ``finish_reason`` is ``"tool_calls"`` (``"length"`` if cut short),
    ``token_ids``/``logprobs`` stay those of the whole generated text, and a stream never shows the
    markup (the special-token tags some tokenizers use are kept in the text). Attempts that are no
    call stay in the content and count in ``stats.malformed_tool_calls``. Without ``tools`` the
    text is never parsed.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "smollm2",
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: DTypeName = "auto",
        name: str | None = None,
        max_batch_size: int = 64,
        batch_window: float = 0.01,
        max_tokens: int = 1024,
        trust_remote_code: bool = False,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        chat_template: str | None = None,
    ) -> None:
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(
                f"LocalClient needs torch and transformers ({exc}): pip install 'palaestra[local]'"
            ) from exc
        from palaestra.clients.default_model import chat_template_for, resolve_model

        path = resolve_model(str(model))
        if chat_template is None:
            chat_template = chat_template_for(str(model))
        if gguf_file is None and path.endswith(".gguf") and os.path.isfile(path):
            path, gguf_file = os.path.split(os.path.abspath(path))
        torch_device = pick_device(device)
        torch_dtype = pick_dtype(dtype, torch_device)
        options = {"gguf_file": gguf_file, "trust_remote_code": trust_remote_code}
        tokenizer = AutoTokenizer.from_pretrained(path, **options)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **options)
        hf_model = hf_model.to(torch_device)  # type: ignore[arg-type]  # a transformers decorator hides .to()'s signature
        self._setup(
            hf_model,
            tokenizer,
            name or str(model),
            max_batch_size,
            batch_window,
            max_tokens,
            prefix_cache_bytes,
        )

    @classmethod
    def from_model(
        cls,
        hf_model: Any,
        tokenizer: Any,
        *,
        name: str | None = None,
        max_batch_size: int = 64,
        batch_window: float = 0.01,
        max_tokens: int = 1024,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    ) -> LocalClient:
        """A client over an already loaded model and tokenizer (kept as they are: device, dtype)."""
        client = cls.__new__(cls)
        client._setup(
            hf_model,
            tokenizer,
            name or hf_model.name_or_path,
            max_batch_size,
            batch_window,
            max_tokens,
            prefix_cache_bytes,
        )
        return client

    def _setup(
        self,
        hf_model: Any,
        tokenizer: Any,
        name: str,
        max_batch_size: int,
        window: float,
        max_tokens: int,
        prefix_cache_bytes: int,
    ) -> None:
        from palaestra.clients.local_engine import Engine

        if max_batch_size < 1 or window < 0 or max_tokens < 1 or prefix_cache_bytes < 0:
            raise ValueError(
                "max_batch_size and max_tokens must be at least 1, batch_window and "
                "prefix_cache_bytes at least 0"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {name} has no chat template")
        self.model = name
        self.hf_model = hf_model.eval()
        self.tokenizer = tokenizer
        self.device: torch.device = next(hf_model.parameters()).device
        self.dtype: torch.dtype = next(hf_model.parameters()).dtype
        self.max_batch_size = max_batch_size
        self.batch_window = window
        self.max_tokens = max_tokens
        self.stats = LocalStats()
        eos = hf_model.generation_config.eos_token_id if hf_model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_ids = set(eos) | ({tokenizer.eos_token_id} - {None})
        if not self.eos_token_ids:
            raise ValueError(f"{name} has no EOS token: replies could never end")
        # a PEFT model's forward takes **kwargs and hands them to its base model: read the base's
        base = hf_model.get_base_model() if hasattr(hf_model, "get_base_model") else hf_model
        self.forward_args = set(inspect.signature(base.forward).parameters)
        added = getattr(tokenizer, "added_tokens_decoder", {})
        self.special_ids = frozenset(i for i, token in added.items() if token.special)
        tags = {added[i].content: i for i in self.special_ids}  # decoding would drop these tool tags
        self.tool_tag_ids = frozenset(tags[t] for t in (tool_calls.OPEN, tool_calls.CLOSE) if t in tags)
        self._entropy = random.Random()
        self._engine: Engine = Engine(self, prefix_cache_bytes=prefix_cache_bytes)

    # -- requests ------------------------------------------------------------------------------

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        """One reply to ``messages``, generated in the running batch."""
        loop = asyncio.get_running_loop()
        request = self._request(messages, tools, sampling, loop)
        request.future = loop.create_future()
        self._engine.submit(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # the worker frees the row at its next step
            raise

    async def chat_stream(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> AsyncIterator[ChatChunk]:
        """The reply as it is generated: a chunk per token (text held back while it could still be
        a partial character or the start of a stop string); the last chunk carries the response.
        Closing the iterator or cancelling its task cancels the generation and frees its row."""
        loop = asyncio.get_running_loop()
        request = self._request(messages, tools, sampling, loop)
        request.queue = asyncio.Queue()
        self._engine.submit(request)
        try:
            while True:
                item = await request.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.response is not None:
                    return
        finally:
            if not request.done:
                request.cancelled = True

    def _request(
        self,
        messages: Messages,
        tools: list[dict[str, Any]] | None,
        sampling: Sampling,
        loop: asyncio.AbstractEventLoop,
    ) -> Request:
        from palaestra.clients.local_engine import Request

        if self._engine.closed:
            raise ModelError(f"the LocalClient of {self.model} is closed")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of chat messages")
        unknown = set(sampling.extra) - set(SAMPLING_EXTRA)
        if unknown:
            raise ValueError(f"LocalClient does not support sampling.extra {sorted(unknown)}; it knows top_k")
        max_tokens = self.max_tokens if sampling.max_tokens is None else sampling.max_tokens
        temperature = 1.0 if sampling.temperature is None else float(sampling.temperature)
        top_p = 1.0 if sampling.top_p is None else float(sampling.top_p)
        top_k = int(sampling.extra.get("top_k") or 0)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if temperature < 0 or not 0 < top_p <= 1 or top_k < -1:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= -1 (got {sampling})")
        if tools and not chat_template.takes_tools(self.tokenizer):
            raise ValueError(f"the chat template of {self.model} does not take tools")
        context = getattr(self.hf_model.config, "max_position_embeddings", None)
        if context is not None:  # refuse a huge prompt before tokenising it (that alone can take minutes)
            chars = sum(len(content_text(m.get("content"))) for m in messages if isinstance(m, dict))
            if chars > MAX_CHARS_PER_TOKEN * context:
                raise ValueError(
                    f"the prompt is {chars:,} characters: far more than the {context} tokens "
                    f"{self.model} takes"
                )
        stop = [sampling.stop] if isinstance(sampling.stop, str) else [s for s in sampling.stop or [] if s]
        seed = self._entropy.getrandbits(63) if sampling.seed is None else sampling.seed
        return Request(messages, tools, temperature, top_p, max(top_k, 0), max_tokens, stop, seed, loop)

    # -- weights and lifetime ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Let the requests in flight finish (admitting none), and hold new ones while the block
        runs: the place to change ``hf_model`` in place (an optimizer step, loading a LoRA
        adapter). Every cached prefix is dropped on the way out: its states are stale."""
        engine = self._engine
        engine.hold()
        acquired = asyncio.get_running_loop().run_in_executor(None, engine.model_lock.acquire)
        try:
            await asyncio.shield(acquired)
        except asyncio.CancelledError:
            acquired.add_done_callback(lambda _: _release(engine))
            raise
        try:
            yield
        finally:
            engine.drop_prefixes()
            engine.model_lock.release()
            engine.release()

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` (parameter or buffer name → tensor; a subset is fine) into ``hf_model``
        in place, between batches. Names and shapes are all checked before anything is copied."""
        async with self.paused():
            await asyncio.to_thread(self._copy_weights, state_dict)

    def _copy_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        import torch

        own = dict(self.hf_model.named_parameters(remove_duplicate=False))
        own.update(self.hf_model.named_buffers(remove_duplicate=False))
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            raise KeyError(f"{len(unknown)} names are not in the model, e.g. {unknown[:3]}")
        wrong = [k for k, v in state_dict.items() if tuple(v.shape) != tuple(own[k].shape)]
        if wrong:
            raise ValueError(
                f"shape mismatch for {wrong[:3]}: e.g. {tuple(state_dict[wrong[0]].shape)} "
                f"given, {tuple(own[wrong[0]].shape)} in the model"
            )
        with torch.no_grad():
            for key, value in state_dict.items():
                own[key].copy_(value)

    def render(self, messages: Messages, tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text the model sees: the chat template with the generation prompt."""
        return chat_template.render(self.tokenizer, messages, tools=tools)

    async def aclose(self) -> None:
        """Finish the requests in flight and queued, then stop the worker; later chats raise ``ModelError``."""
        await asyncio.to_thread(self._engine.close)

    async def __aenter__(self) -> LocalClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def pick_device(device: str) -> torch.device:
    """``"auto"``: CUDA when present, else CPU; anything else is passed to ``torch.device``."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: DTypeName, device: torch.device) -> torch.dtype:
    """``"auto"``: bfloat16 on CUDA (float16 without bf16 support), ``CPU_DTYPE`` on CPU."""
    import torch

    if dtype == "auto":
        if device.type == "cuda":
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dtype = CPU_DTYPE
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, not {dtype!r}")
    return getattr(torch, dtype)


def _release(engine: Engine) -> None:
    """Undo ``paused()``'s hold and lock (its waiting was cancelled after the lock was taken)."""
    engine.model_lock.release()
    engine.release()

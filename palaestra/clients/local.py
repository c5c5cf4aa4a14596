"""LocalClient: a Hugging Face causal LM in this process, with batched generation.

Concurrent ``chat()`` calls are queued; a runner task on the event loop gathers the requests that
arrive within ``batch_window`` seconds (up to ``max_batch_size``) and hands the batch to one worker
thread, so the event loop never waits on the model. The worker owns the tokenizer and the model:
it renders each chat template, left-pads the prompts, prefills them in one forward pass and then
decodes one token per row per step over a KV cache. A row that finishes (EOS, a stop string, its
own ``max_tokens``) is answered at once and dropped from the batch, so it costs no more compute.
Requests that arrive while a batch runs form the next batch (no joining mid-batch).

Sampling is per request: temperature (0 is greedy), then top-k (``sampling.extra["top_k"]``),
then top-p, as in transformers' ``generate``. Each sampled row draws its token with the
Gumbel-max trick from its own ``torch.Generator`` seeded by ``sampling.seed``, so a seeded
request samples the same noise whatever else shares its batch. The limit: logits of one prompt
differ in the last bits between batch shapes (padding, rows dropped), which flips a sample in a
near-tie. In float32 no flip showed (tests; 32 of 32 SmolLM2 replies of 64 tokens equal alone and
batched); in bfloat16 most replies flip somewhere, so there a seed reproduces a reply only with the
same batch. Unseeded requests get fresh entropy.

Logprobs are those of the returned tokens under the distribution actually sampled from: the
log-softmax of the temperature-scaled logits after top-k/top-p filtering, renormalised. Greedy
rows (temperature 0) report the model's own log-softmax at temperature 1. ``token_ids`` are every
sampled token: the EOS token that ended a reply, and the tokens of a stop string, are included
(the text is cut before them).

Dtype: ``"auto"`` is bfloat16 on CUDA (float16 without bf16) and float32 on CPU. Measured with
SmolLM2-135M on a 2-core CPU (benchmarks/local_generation.md): bf16 was 1.13x faster at 32
concurrent requests and 1.46x at 64, but its logprobs were off from fp32 ones by 0.037 per token
on average (0.3 per 64-token reply; 3e-6 in fp32), and 25 of 32 seeded replies changed when
batched with others (none in fp32). On CPU, honest logprobs and reproducible seeds win; pass
``dtype="bfloat16"`` for evaluation-only throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from palaestra import chat_template
from palaestra.clients.base import ModelError
from palaestra.types import Messages, ModelResponse, Sampling, Usage

if TYPE_CHECKING:
    import torch

DTypeName = Literal["auto", "bfloat16", "float16", "float32"]
CPU_DTYPE: DTypeName = "float32"  # why: see the module docstring
SAMPLING_EXTRA = ("top_k",)


@dataclass
class LocalStats:
    """Counters of the generation loop: how many batches, rows and forward passes ran."""

    batches: int = 0
    requests: int = 0
    steps: int = 0  # forward passes: one prefill plus one per decoded token, per batch
    tokens: int = 0  # completion tokens generated
    largest_batch: int = 0


@dataclass
class _Request:
    messages: Messages
    tools: list[dict[str, Any]] | None
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: list[str]
    seed: int
    future: asyncio.Future[ModelResponse] = field(init=False)
    loop: asyncio.AbstractEventLoop = field(init=False)
    cancelled: bool = False
    done: bool = False
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class LocalClient:
    """Chat with a transformers causal LM loaded in this process; see the module docstring.

    ``model`` is a model directory, a hub id (where the hub is reachable), a ``.gguf`` file, or an
    alias of ``default_model.resolve_model`` (``"smollm2"``, the default). ``hf_model`` is the
    ``torch.nn.Module`` itself: a trainer may change its weights in place inside
    ``async with client.paused():`` or through ``update_weights``.
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
    ) -> None:
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(f"LocalClient needs torch and transformers ({exc}): "
                              "pip install 'palaestra[local]'") from exc  # fmt: skip
        from palaestra.clients.default_model import resolve_model

        path = resolve_model(str(model))
        if gguf_file is None and path.endswith(".gguf") and os.path.isfile(path):
            path, gguf_file = os.path.split(os.path.abspath(path))
        torch_device = pick_device(device)
        torch_dtype = pick_dtype(dtype, torch_device)
        options = {"gguf_file": gguf_file, "trust_remote_code": trust_remote_code}
        tokenizer = AutoTokenizer.from_pretrained(path, **options)
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **options)
        hf_model = hf_model.to(torch_device)  # type: ignore[arg-type]  # a transformers decorator hides .to()'s signature
        self._setup(hf_model, tokenizer, name or str(model), max_batch_size, batch_window, max_tokens)

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
    ) -> LocalClient:
        """A client over an already loaded model and tokenizer (kept as they are: device, dtype)."""
        client = cls.__new__(cls)
        client._setup(
            hf_model, tokenizer, name or hf_model.name_or_path, max_batch_size, batch_window, max_tokens
        )
        return client

    def _setup(
        self, hf_model: Any, tokenizer: Any, name: str, max_batch_size: int, window: float, max_tokens: int
    ) -> None:

        if max_batch_size < 1 or window < 0 or max_tokens < 1:
            raise ValueError("max_batch_size and max_tokens must be at least 1, batch_window at least 0")
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
        self._pad_id = next(t for t in (tokenizer.pad_token_id, min(self.eos_token_ids)) if t is not None)
        self._context = getattr(hf_model.config, "max_position_embeddings", None)
        takes = inspect.signature(hf_model.forward).parameters
        self._keep_arg = "logits_to_keep" in takes
        self._cache_arg = "cache" if "cache" in takes else "past_key_values"  # renamed in transformers 5
        self._pending: deque[_Request] = deque()
        self._runner: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="palaestra-local")
        self._model_lock = threading.Lock()
        self._closed = False
        self._entropy = random.Random()

    # -- the event-loop side -------------------------------------------------------------------

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, sampling: Sampling
    ) -> ModelResponse:
        if self._closed:
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
        stop = [sampling.stop] if isinstance(sampling.stop, str) else [s for s in sampling.stop or [] if s]
        seed = self._entropy.getrandbits(63) if sampling.seed is None else sampling.seed
        loop = asyncio.get_running_loop()
        request = _Request(messages, tools, temperature, top_p, max(top_k, 0), max_tokens, stop, seed)
        request.future, request.loop = loop.create_future(), loop
        self._pending.append(request)
        if self._runner is None or self._runner.done() or self._runner.get_loop() is not loop:
            self._runner = loop.create_task(self._run_batches())
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # the worker drops the row at its next step
            raise

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            if len(self._pending) < self.max_batch_size and self.batch_window:
                await asyncio.sleep(self.batch_window)  # let concurrent requests join this batch
            batch: list[_Request] = []
            while self._pending and len(batch) < self.max_batch_size:
                request = self._pending.popleft()
                if not (request.cancelled or request.future.done() or request.loop.is_closed()):
                    batch.append(request)
            if not batch:
                continue
            try:
                await loop.run_in_executor(self._executor, self._generate, batch)
            except RuntimeError as exc:  # closed meanwhile: no thread will ever run this batch
                for request in batch:
                    _settle(request.future, ModelError(f"the LocalClient of {self.model} is closed: {exc}"))

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Wait for the batch in flight to finish and hold the next one while the block runs:
        the place to change ``hf_model`` in place (an optimizer step, loading a LoRA adapter)."""
        acquired = asyncio.get_running_loop().run_in_executor(None, self._model_lock.acquire)
        try:
            await asyncio.shield(acquired)
        except asyncio.CancelledError:
            acquired.add_done_callback(lambda _: self._model_lock.release())
            raise
        try:
            yield
        finally:
            self._model_lock.release()

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
            raise ValueError(f"shape mismatch for {wrong[:3]}: e.g. {tuple(state_dict[wrong[0]].shape)} "
                             f"given, {tuple(own[wrong[0]].shape)} in the model")  # fmt: skip
        with torch.no_grad():
            for key, value in state_dict.items():
                own[key].copy_(value)

    def render(self, messages: Messages, tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text the model sees: the chat template with the generation prompt."""
        return chat_template.render(self.tokenizer, messages, tools=tools)

    async def aclose(self) -> None:
        """Wait for the batch in flight, then stop the worker thread; later chats raise ``ModelError``."""
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def __aenter__(self) -> LocalClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the worker thread ---------------------------------------------------------------------

    def _generate(self, batch: list[_Request]) -> None:
        """Run one batch to the end, answering each request as its row finishes."""
        import torch

        with self._model_lock:
            rows = []
            for request in batch:
                try:
                    request.prompt_ids = chat_template.prompt_ids(
                        self.tokenizer, request.messages, tools=request.tools
                    )
                    if self._context is not None:
                        room = self._context - len(request.prompt_ids)
                        if room < 1:
                            raise ValueError(f"the prompt is {len(request.prompt_ids)} tokens; "
                                             f"{self.model} takes at most {self._context}")  # fmt: skip
                        request.max_tokens = min(request.max_tokens, room)
                    rows.append(request)
                except Exception as exc:  # noqa: BLE001 - a bad request fails alone, not its batch
                    self._answer(request, exc)
            if not rows:
                return
            self.stats.batches += 1
            self.stats.requests += len(rows)
            self.stats.largest_batch = max(self.stats.largest_batch, len(rows))
            try:
                with torch.inference_mode():
                    self._decode(rows)
            except Exception as exc:  # noqa: BLE001 - reported to each request of this batch
                error = ModelError(f"local generation failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                for request in rows:
                    if not request.done:
                        self._answer(request, error)

    def _decode(self, rows: list[_Request]) -> None:
        import torch
        from transformers import DynamicCache

        device, width = self.device, max(len(r.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, request in enumerate(rows):
            input_ids[i, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask[i, width - len(request.prompt_ids) :] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.hf_model.config)
        params = torch.tensor([[r.temperature, r.top_p, r.top_k] for r in rows], device=device)
        generators = [torch.Generator(device=device) for _ in rows]
        for request, generator in zip(rows, generators, strict=True):
            generator.manual_seed(request.seed & 0xFFFF_FFFF_FFFF_FFFF)
        while True:
            options = {self._cache_arg: cache, **({"logits_to_keep": 1} if self._keep_arg else {})}
            out = self.hf_model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                use_cache=True, **options)  # fmt: skip
            self.stats.steps += 1
            tokens, logprobs = sample(out.logits[:, -1, :].float(), params, generators)
            self.stats.tokens += len(rows)  # counted before any reply is sent, so a caller sees it
            alive = []
            step = zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)
            for i, (request, token, logprob) in enumerate(step):
                request.token_ids.append(token)
                request.logprobs.append(logprob)
                if not (request.cancelled or self._finished(request)):
                    alive.append(i)
            if not alive:
                return
            if len(alive) < len(rows):  # drop finished rows: they cost nothing from here on
                index = torch.tensor(alive, device=device)
                cache.batch_select_indices(index)
                mask, positions, params, tokens = mask[index], positions[index], params[index], tokens[index]
                rows, generators = [rows[i] for i in alive], [generators[i] for i in alive]
            input_ids = tokens[:, None]
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)

    def _finished(self, request: _Request) -> bool:
        """Answer ``request`` if its last token ended it; says whether it did."""
        ids = request.token_ids
        if ids[-1] in self.eos_token_ids:
            return self._reply(request, self._text(ids[:-1]), "stop")
        if request.stop:
            text = self._text(ids)
            cuts = [i for i in (text.find(s) for s in request.stop) if i >= 0]
            if cuts:
                return self._reply(request, text[: min(cuts)], "stop")
        if len(ids) >= request.max_tokens:
            return self._reply(request, self._text(ids), "length")
        return False

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _reply(self, request: _Request, text: str, finish: str) -> bool:
        usage = Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=len(request.token_ids))
        message = {"role": "assistant", "content": text}
        reply = ModelResponse(
            message,
            finish,
            usage,
            token_ids=request.token_ids,
            logprobs=request.logprobs,
            prompt_token_ids=request.prompt_ids,
        )
        self._answer(request, reply)
        return True

    def _answer(self, request: _Request, result: ModelResponse | BaseException) -> None:
        request.done = True
        with contextlib.suppress(RuntimeError):  # the caller's event loop is already closed
            request.loop.call_soon_threadsafe(_settle, request.future, result)


def sample(
    logits: torch.Tensor, params: torch.Tensor, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row, and its logprob, from float32 ``logits`` [rows, vocab].

    ``params`` rows are (temperature, top_p, top_k); temperature 0 is greedy, top_k 0 is off.
    A sampled row's token is the Gumbel-max of its filtered logprobs with noise from its own
    generator, so it does not depend on the other rows.
    """
    import torch

    temperature, top_p, top_k = params.unbind(-1)
    greedy = temperature == 0
    scores = logits / torch.where(greedy, 1.0, temperature)[:, None]
    filtered = ~greedy & (top_k > 0)
    if filtered.any():
        k = top_k.clamp(1, scores.shape[-1]).long()
        kth = torch.topk(scores, int(k.max())).values.gather(1, (k - 1)[:, None])
        scores = scores.masked_fill(filtered[:, None] & (scores < kth), float("-inf"))
    filtered = ~greedy & (top_p < 1)
    if filtered.any():
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        drop = ((probs.cumsum(-1) - probs) >= top_p[:, None]) & filtered[:, None]
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    logprobs = scores.log_softmax(-1)
    noise = torch.zeros_like(logprobs)
    for i in (~greedy).nonzero().flatten().tolist():
        noise[i] = -torch.empty_like(noise[i]).exponential_(generator=generators[i]).log()
    tokens = (logprobs + noise).argmax(-1)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _settle(future: asyncio.Future[ModelResponse], result: ModelResponse | BaseException) -> None:
    if not future.done():
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


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

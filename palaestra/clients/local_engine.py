"""The generation loop of LocalClient: continuous batching with prefix reuse, in one worker thread.

The event loop only queues requests (``submit``) and receives results through
``call_soon_threadsafe``; the worker thread owns the model and the tokenizer. While there is
work it repeats one step: the running batch decodes one token per row (``RowBatch``), then
queued requests join: each is rendered with the chat template, its longest cached prefix is
taken from the ``PrefixCache`` and only the rest of its prompt is prefilled (alone, batch 1),
its first token is sampled from the prefill's logits, and its states are copied into a free row.
A row that ends (EOS, a stop string, its ``max_tokens``, its caller gone) is answered at once,
its states (prompt + reply) go to the prefix cache for the conversation's next turn, and the
row is freed for the next request. A failing forward pass fails the requests in flight
(the running batch and those joining), as a failing batch did, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from palaestra import chat_template, tool_calls
from palaestra.clients.base import ModelError
from palaestra.clients.local_batch import RowBatch
from palaestra.clients.local_prefix import KV, PrefixCache
from palaestra.clients.local_sampling import releasable, sample
from palaestra.types import ChatChunk, Messages, ModelResponse, Usage

SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF
ATTENTION_LAYERS = {"full_attention", "sliding_attention"}


@dataclass(eq=False)
class Request:
    """One chat request and its progress; ``future`` (chat) or ``queue`` (chat_stream) gets the result."""

    messages: Messages
    tools: list[dict[str, Any]] | None
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: list[str]
    seed: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[ModelResponse] | None = None
    queue: asyncio.Queue[ChatChunk | BaseException] | None = None
    cancelled: bool = False  # the caller went away: free the row at the next step
    done: bool = False
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    shown: int = 0  # characters of the reply's text already streamed (with tools: up to here)
    sent: int = 0  # tokens already streamed

    @property
    def params(self) -> list[float]:
        return [self.temperature, self.top_p, float(self.top_k)]

    def answer(self, result: ModelResponse | ChatChunk | BaseException) -> None:
        """Hand ``result`` to the caller's event loop (from the worker thread)."""
        self.done = True
        self.deliver(result)

    def deliver(self, item: ModelResponse | ChatChunk | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's event loop is already closed
            if self.queue is not None:
                assert not isinstance(item, ModelResponse)  # a stream gets chunks
                self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
            else:
                self.loop.call_soon_threadsafe(self._settle, item)

    def _settle(self, result: Any) -> None:
        if self.future is not None and not self.future.done():
            if isinstance(result, BaseException):
                self.future.set_exception(result)
            else:
                self.future.set_result(result)


class Engine:
    """The worker side of LocalClient: the queue, the step loop, the running batch, the prefix cache."""

    def __init__(self, client: Any, *, prefix_cache_bytes: int) -> None:
        self.client = client  # LocalClient: model, tokenizer, limits and stats
        self.prefix = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
        self.model_lock = threading.Lock()  # held by a busy loop, or by ``paused()``
        self._lock = threading.Lock()  # guards the queue and the flags below
        self._pending: deque[Request] = deque()
        self._running = False
        self._holds = 0  # paused() blocks waiting for the batch in flight to drain
        self.closed = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="palaestra-local")
        self._counted = False
        model = client.hf_model
        text_config = model.config.get_text_config(decoder=True)
        kinds = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        if not kinds <= ATTENTION_LAYERS:  # the running batch keeps key/value states only
            raise ValueError(
                f"LocalClient runs attention-only decoders; {client.model} has layers of "
                f"types {sorted(kinds - ATTENTION_LAYERS)}"
            )
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in client.forward_args else {}
        self._cache_arg = "cache" if "cache" in client.forward_args else "past_key_values"
        self._context = getattr(model.config, "max_position_embeddings", None)

    # -- called from event loops ---------------------------------------------------------------

    def submit(self, request: Request) -> None:
        with self._lock:
            if self.closed:
                raise ModelError(f"the LocalClient of {self.client.model} is closed")
            self._pending.append(request)
            self._kick()

    def hold(self) -> None:
        """Admit no new request until ``release``: the running batch drains, then the loop stops."""
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        with self._lock:
            self._holds -= 1
            self._kick()

    def drop_prefixes(self) -> None:
        """Forget every cached prefix (call with ``model_lock`` held: the weights changed)."""
        if self.prefix is not None:
            self.prefix.clear()
            self._sync_cache_stats()

    def close(self) -> None:
        """Finish the work in flight and queued, stop the thread; blocks (run it off the event loop)."""
        with self._lock:
            self.closed = True
        self._executor.shutdown(wait=True)
        with self._lock:
            left, self._pending = list(self._pending), deque()
        self._fail(left, ModelError(f"the LocalClient of {self.client.model} is closed"))

    def _kick(self) -> None:
        """Start a busy loop if there is work and none runs (with ``_lock`` held)."""
        if self._running or self._holds or not self._pending:
            return
        try:
            self._executor.submit(self._serve)
            self._running = True
        except RuntimeError as exc:  # shut down meanwhile: no thread will ever run these
            left, self._pending = list(self._pending), deque()
            self._fail(left, ModelError(f"the LocalClient of {self.client.model} is closed: {exc}"))

    # -- the worker thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        """One busy period: steps until nothing runs and nothing waits (or a hold drained the batch)."""
        client = self.client
        batch = RowBatch(client.device, client.dtype, client.max_batch_size)
        try:
            with self.model_lock:
                while True:
                    if not batch.rows and 0 < len(self._pending) < client.max_batch_size:
                        time.sleep(client.batch_window)  # let concurrent requests start together
                    if (joining := self._admit(batch)) is None:
                        break
                    client.stats.batches += not batch.rows
                    with torch.inference_mode():
                        self._step(batch, joining)
        except BaseException as exc:  # a bug in the loop itself: fail everything rather than hang
            with self._lock:
                self._running, left, self._pending = False, list(self._pending), deque()
            self._fail(batch.requests + left, ModelError(f"local generation stopped: {exc!r}"))
            raise
        finally:
            batch.release()
            client.stats.active = 0

    def _admit(self, batch: RowBatch) -> list[Request] | None:
        """The queued requests that join now; ``None`` ends the busy period."""
        joining: list[Request] = []
        with self._lock:
            room = 0 if self._holds else self.client.max_batch_size - batch.rows
            while self._pending and len(joining) < room:
                request = self._pending.popleft()
                if request.cancelled or request.loop.is_closed():
                    self.client.stats.cancelled += 1
                elif not (request.future is not None and request.future.done()):
                    joining.append(request)
            if not joining and not batch.rows:
                self._running = False
                return None
        return joining

    def _step(self, batch: RowBatch, joining: list[Request]) -> None:
        self._counted = False  # the step is counted once, before its first token is answered
        try:
            if batch.rows:
                self._decode(batch)
            for request in joining:
                self._start(batch, request)
        except Exception as exc:  # noqa: BLE001 - reported to every request in flight, then go on
            error = ModelError(f"local generation failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._fail(batch.requests + joining, error)
            batch.release()
            self.client.stats.active = 0

    def _count(self, tokens: int) -> None:
        """Count ``tokens`` new tokens (and the step, once) before any of them reaches a caller."""
        stats = self.client.stats
        stats.steps += not self._counted
        stats.tokens += tokens
        self._counted = True

    def _start(self, batch: RowBatch, request: Request) -> None:
        """Prefill ``request`` (from its longest cached prefix), sample its first token, give it a row."""
        client = self.client
        try:
            ids = chat_template.prompt_ids(client.tokenizer, request.messages, tools=request.tools)
            if self._context is not None:
                room = self._context - len(ids)
                if room < 1:
                    raise ValueError(
                        f"the prompt is {len(ids)} tokens; {client.model} takes at most {self._context}"
                    )
                request.max_tokens = min(request.max_tokens, room)
        except Exception as exc:  # noqa: BLE001 - a bad request fails alone
            request.answer(exc)
            return
        request.prompt_ids = ids
        client.stats.requests += 1
        client.stats.prompt_tokens += len(ids)
        request.generator = torch.Generator(device=client.device)
        request.generator.manual_seed(request.seed & SEED_MASK)
        kv, logits = self._prompt_states(ids)
        params = torch.tensor([request.params], device=client.device)
        token, logprob = sample(logits[None], params, [request.generator])
        self._count(1)
        if not self._emit(request, int(token), float(logprob)):
            batch.add(request, kv)
            client.stats.active = batch.rows
            client.stats.largest_batch = max(client.stats.largest_batch, batch.rows)

    def _prompt_states(self, ids: list[int]) -> tuple[KV, torch.Tensor]:
        """The KV states of ``ids`` and the next-token logits, computing only what the cache lacks."""
        stats, length = self.client.stats, len(ids)
        entry, reused = self.prefix.match(ids) if self.prefix is not None else (None, 0)
        if entry is not None and reused == length and length in entry.logits:
            kv, logits = [(k[:, :length], v[:, :length]) for k, v in entry.kv], entry.logits[length]
        else:
            reused = min(reused, length - 1)  # the last prompt token must run to give logits
            past = (
                [(k[None, :, :reused], v[None, :, :reused]) for k, v in entry.kv]
                if entry and reused
                else None
            )
            kv, logits = self._prefill(ids, reused, past)
            if self.prefix is not None:
                self.prefix.add(ids, kv, {length: logits})
                self._sync_cache_stats()
        stats.prompt_tokens_computed += length - reused
        stats.cache_hits += reused > 0
        return kv, logits

    def _prefill(self, ids: list[int], reused: int, past: KV | None) -> tuple[KV, torch.Tensor]:
        from transformers import DynamicCache

        device = self.client.device
        cache = DynamicCache(past) if past else DynamicCache()
        out = self.client.hf_model(
            input_ids=torch.tensor([ids[reused:]], device=device),
            position_ids=torch.arange(reused, len(ids), device=device)[None],
            use_cache=True,
            **{self._cache_arg: cache},
            **self._keep,
        )
        kv = [(layer.keys[0], layer.values[0]) for layer in cache.layers]  # type: ignore[union-attr, index]  # attention layers only (checked when the client is built)
        return kv, out.logits[0, -1].float().clone()

    def _decode(self, batch: RowBatch) -> None:
        """One token for every running row; rows that end are answered and freed."""
        client = self.client
        for row in reversed(range(batch.rows)):  # callers gone: their rows stop costing compute now
            if batch.requests[row].cancelled:
                self._retire(batch, row)
                client.stats.cancelled += 1
        if not batch.rows:
            return
        mask, positions = batch.step_inputs()
        requests = list(batch.requests)
        out = client.hf_model(
            input_ids=torch.tensor([[r.token_ids[-1]] for r in requests], device=client.device),
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: batch.cache},
            **self._keep,
        )
        batch.advance()
        params = torch.tensor([r.params for r in requests], device=client.device)
        tokens, logprobs = sample(out.logits[:, -1, :].float(), params, [r.generator for r in requests])
        self._count(len(requests))
        step = zip(requests, tokens.tolist(), logprobs.tolist(), strict=True)
        ended = [row for row, (request, *token) in enumerate(step) if self._emit(request, *token)]
        for row in reversed(ended):
            self._retire(batch, row)

    def _retire(self, batch: RowBatch, row: int) -> None:
        """Free ``row``; its states (prompt + reply but the last token) become a cached prefix."""
        request = batch.requests[row]
        if self.prefix is not None:
            self.prefix.add(request.prompt_ids + request.token_ids[:-1], batch.states(row))
            self._sync_cache_stats()
        batch.remove(row)
        self.client.stats.active = batch.rows

    def _emit(self, request: Request, token: int, logprob: float) -> bool:
        """Record a sampled token; answer ``request`` if it ended, else stream it. Says whether it ended."""
        request.token_ids.append(token)
        request.logprobs.append(logprob)
        ids, text = request.token_ids, None
        if token in self.client.eos_token_ids:
            return self._reply(request, self._text(ids[:-1], request), "stop")
        if request.stop or request.queue is not None:
            text = self._text(ids, request)
            cuts = [i for i in (text.find(s) for s in request.stop) if i >= 0]
            if cuts:
                return self._reply(request, text[: min(cuts)], "stop")
        if len(ids) >= request.max_tokens:
            return self._reply(request, self._text(ids, request) if text is None else text, "length")
        if request.queue is not None and text is not None:
            end = releasable(text, request.stop)
            if request.tools:  # stream only content: never tool-call markup (nor whitespace it strips)
                start, end = tool_calls.content_span(text[:end])
                request.shown = max(request.shown, start)
            end = max(end, request.shown)
            new = slice(request.sent, None)
            chunk = ChatChunk(text[request.shown : end], ids[new], request.logprobs[new])
            request.shown, request.sent = end, len(ids)
            request.deliver(chunk)
        return False

    def _text(self, ids: list[int], request: Request) -> str:
        tags = self.client.tool_tag_ids
        if request.tools and tags:  # the template's <tool_call> tags are special tokens: keep them
            special = self.client.special_ids - tags
            kept = [i for i in ids if i not in special]
            return str(self.client.tokenizer.decode(kept, skip_special_tokens=False))
        return str(self.client.tokenizer.decode(ids, skip_special_tokens=True))

    def _reply(self, request: Request, text: str, finish: str) -> bool:
        usage = Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=len(request.token_ids))
        message: dict[str, Any] = {"role": "assistant", "content": text}
        shown = request.shown
        if request.tools:  # Hermes tool calls; token_ids and logprobs stay those of the whole text
            shown = len(text[:shown].lstrip())  # the streamed content: text[:shown] without leading space
            parsed = tool_calls.parse(text, ended=finish == "stop")
            message["content"] = text = parsed.content
            self.client.stats.malformed_tool_calls += parsed.malformed
            if parsed.tool_calls:
                message["tool_calls"] = parsed.tool_calls
                finish = "tool_calls" if finish == "stop" else finish  # cut at max_tokens: still "length"
        reply = ModelResponse(
            message,
            finish,
            usage,
            token_ids=request.token_ids,
            logprobs=request.logprobs,
            prompt_token_ids=request.prompt_ids,
        )
        if request.queue is None:
            request.answer(reply)
        else:
            new = slice(request.sent, None)
            request.answer(ChatChunk(text[shown:], request.token_ids[new], request.logprobs[new], reply))
        return True

    def _fail(self, requests: list[Request], error: BaseException) -> None:
        for request in requests:
            if not request.done:
                request.answer(error)

    def _sync_cache_stats(self) -> None:
        stats, prefix = self.client.stats, self.prefix
        if prefix is not None:
            stats.cache_bytes, stats.cache_entries = prefix.nbytes, len(prefix)
            stats.cache_evictions = prefix.evictions

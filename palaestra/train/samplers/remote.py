"""The remote sampler: a server that speaks vLLM's OpenAI API, reached the way ``palaestra eval``
reaches any endpoint (``OpenAIClient`` over HTTP), plus vLLM's weight-sync endpoints (``sync.py``).

Every request asks for ``return_token_ids`` and ``logprobs``: vLLM (since 0.10.2) then returns the
completion's token ids (``choices[0].token_ids``), the prompt's (``prompt_token_ids``) and each
sampled token's logprob, which are what the trainer trains on. Those logprobs must be of the
distribution vLLM sampled from, after temperature and top-p: start vLLM with ``--logprobs-mode
processed_logprobs`` (its default, ``raw_logprobs``, reports the model's distribution before them).

``start()`` (before the first step) runs ``sampler.command`` if there is one, finds the served
model's name, pushes the starting weights and sends one probe request: an unreachable server, a
server without the weight-sync endpoints and one that returns no token ids are each one line there.
Between steps ``sync()`` pushes new weights; ``failure()`` says why the server can sample no more
(its process exited, it does not answer), so a step whose batch it broke off is never trained on.

Under torchrun, every rank samples its share of the groups from the one server, and only rank 0
owns it: rank 0 runs ``sampler.command``, pushes each version's weights (every rank holds the
same ones) and then broadcasts the model name to ask for (a LoRA adapter's name changes per
version), or why it could not; the other ranks wait for that broadcast in ``start`` and in each
``sync``, so no rank samples before the weights it should sample are served. Every rank calls
``sync`` for the same versions in the same order (``off_policy.Batches`` pushes at the same points
on each; sampling ahead, it pushes when rank 0 finds the sampler idle): the broadcasts pair up. With ``train.fsdp`` each rank holds only shards of the weights:
before each push (in ``start`` and ``sync``) every rank takes part in gathering the whole weights
(``Shards.full_weights``, the gather a checkpoint makes), and rank 0 writes those, as a run
without FSDP writes its model's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from palaestra.clients.base import ModelError
from palaestra.clients.openai import OpenAIClient
from palaestra.train.config import ConfigError
from palaestra.train.distributed import World
from palaestra.train.fsdp import Shards
from palaestra.train.rl_config import RLConfig, SamplerConfig
from palaestra.train.samplers.failures import after_rank_0
from palaestra.train.samplers.server import ServerProcess
from palaestra.train.samplers.sync import LoraSync, ReloadSync, SyncError, save_served
from palaestra.types import Sampling

API_KEY_VAR = "PALAESTRA_API_KEY"  # sent as a bearer token when set (palaestra serve reads the same one)
PROBE = [{"role": "user", "content": "hi"}]
Said = tuple[str | None, str | None]  # rank 0's word after a push: (the model name to ask, the problem)


class RemoteSampler:
    """Rollouts sampled by a server (vLLM, or ``palaestra serve``) that gets each new policy version."""

    def __init__(
        self,
        config: SamplerConfig,
        *,
        model: Any,
        tokenizer: Any,
        run_dir: Path,
        lora: bool,
        max_concurrent: int,
        world: World | None = None,
        shards: Shards | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.world = world or World()
        self.shards = shards  # FSDP: the model holds only shards; each push gathers the whole weights
        self.owner = self.world.main  # rank 0 starts the server and pushes the weights
        self.url = config.url.rstrip("/")
        root = self.url.removesuffix("/v1")
        self.weights_dir = Path(config.weights_dir) if config.weights_dir else run_dir / "sampler"
        command = config.command.replace("{weights_dir}", str(self.weights_dir))
        self.external = not config.command  # a server palaestra does not start
        self.server = ServerProcess(command, run_dir / "sampler.log") if command and self.owner else None
        self.wanted_model = config.model
        self.startup_timeout = config.startup_timeout
        key = os.environ.get(API_KEY_VAR, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.headers = headers
        self.client = OpenAIClient(
            config.model or "policy",
            base_url=self.url,
            api_key=key,
            timeout=config.timeout,
            max_connections=max(max_concurrent, 1),
            extra_body={"return_token_ids": True},
        )
        self.weights: LoraSync | ReloadSync = (
            LoraSync(root, headers, self.weights_dir, prefix=f"policy-{secrets.token_hex(3)}")
            if config.sync_for(lora) == "lora"
            else ReloadSync(root, headers, self.weights_dir)
        )
        self.version = 0

    @classmethod
    def of_run(
        cls,
        config: RLConfig,
        model: Any,
        tokenizer: Any,
        run_dir: Path,
        world: World | None = None,
        shards: Shards | None = None,
    ) -> RemoteSampler:
        """The sampler ``config.sampler`` names, for the run of ``config`` in ``run_dir`` (on this
        rank of ``world``; ``shards``: the model sharded by FSDP)."""
        return cls(
            config.sampler,
            model=model,
            tokenizer=tokenizer,
            run_dir=run_dir,
            lora=config.lora.enabled,
            max_concurrent=config.train.max_concurrent,
            world=world,
            shards=shards,
        )

    # -- before the first step -----------------------------------------------------------------

    async def check_reachable(self) -> None:
        """``ConfigError`` unless a server that palaestra does not start itself answers at ``url``."""
        if self.external:
            await self._served_models()

    async def start(self, version: int) -> None:
        """Serve policy ``version`` (the weights the trainer starts from) and check the server
        gives what training needs; ``ConfigError`` (one line) when it cannot. The other ranks
        wait for rank 0 to have done it."""
        self.version = version
        state = await self._whole_weights()  # every rank, first: no rank may stop before the gather
        if not self.owner:
            model, problem = await self._shared(None)
            if problem is not None or model is None:
                await asyncio.to_thread(after_rank_0, self.world)
                raise ConfigError(problem or "")  # rank 0 says it
            self.client.model = model
            return
        try:
            await self._start(version, state)
        except Exception as exc:
            await self._shared((None, str(exc)))  # the other ranks stop too, without a word
            raise
        await self._shared((self.client.model, None))

    async def _start(self, version: int, state: dict[str, Any] | None) -> None:
        if self.server is not None:  # a server palaestra starts serves the starting weights at once
            save_served(
                self.model, self.tokenizer, self.weights_dir, base=self.weights.kind == "lora", state=state
            )
            await self.server.start(self.url, self.startup_timeout)
        served = await self._served_models()
        if self.wanted_model and self.wanted_model not in served:
            raise ConfigError(f"sampler.model {self.wanted_model!r}: {self.url} serves {', '.join(served)}")
        self.client.model = self.wanted_model or served[0]
        await self._probe()
        try:
            await self._push(version, state, written=self.server is not None)
        except SyncError as exc:
            raise ConfigError(str(exc)) from None

    async def _served_models(self) -> list[str]:
        url = self.url + "/models"
        try:
            async with aiohttp.ClientSession(headers=self.headers) as session:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(
                f"sampler.url: cannot reach the sampler server at {self.url} ({str(exc) or type(exc).__name__}); "
                "start it first, or give sampler.command to have palaestra start it"
            ) from None
        try:
            names = [m["id"] for m in orjson.loads(raw)["data"]] if status == 200 else []
        except (orjson.JSONDecodeError, KeyError, TypeError):
            names = []
        if not names:
            raise ConfigError(f"sampler.url: {url} answered HTTP {status} with no model list: is it vLLM?")
        return [str(n) for n in names]

    async def _probe(self) -> None:
        """One short request: the reply must carry the prompt's and the completion's token ids and logprobs."""
        sampling = Sampling(temperature=1.0, max_tokens=1, logprobs=True)
        try:
            reply = await self.client.chat(list(PROBE), sampling=sampling)
        except ModelError as exc:
            raise ConfigError(f"the sampler server at {self.url} failed a probe request: {exc}") from None
        missing = [
            name
            for name, value in (
                ("token ids", reply.token_ids),
                ("prompt token ids", reply.prompt_token_ids),
                ("logprobs", reply.logprobs),
            )
            if value is None
        ]
        if missing:
            raise ConfigError(
                f"the sampler server at {self.url} returned no {' and no '.join(missing)}: training needs "
                "them (vLLM returns them from 0.10.2 on, for return_token_ids and logprobs)"
            )

    # -- between steps -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """The server keeps sampling its own copy of the weights while the trainer's change."""
        self.model.train()
        try:
            yield
        finally:
            self.model.eval()

    async def sync(self, version: int) -> None:
        """Push the trained weights to the server as policy ``version``; ``SyncError`` if it refuses.
        The other ranks wait for rank 0's push, then ask for the model it names."""
        state = await self._whole_weights()  # every rank
        if self.owner:
            try:
                await self._push(version, state)
            except Exception as exc:
                await self._shared((None, str(exc)))
                raise
            await self._shared((self.client.model, None))
        else:
            model, problem = await self._shared(None)
            if problem is not None or model is None:
                raise SyncError(problem or "")
            self.client.model = model
        self.version = version

    async def _shared(self, said: Said | None) -> Said:
        """Rank 0's (model name, problem) on every rank; one process: ``said`` itself."""
        if self.world.size == 1:
            assert said is not None
            return said
        shared = await asyncio.to_thread(self.world.broadcast, said)
        assert shared is not None
        return shared

    async def _whole_weights(self) -> dict[str, Any] | None:
        """With FSDP, the whole model's state dict on rank 0 (empty on the others), gathered by every
        rank (a collective: every rank calls it before each push); without, None (the model is whole)."""
        if self.shards is None:
            return None
        return await asyncio.to_thread(self.shards.full_weights)

    async def _push(self, version: int, state: dict[str, Any] | None, *, written: bool = False) -> None:
        if isinstance(self.weights, LoraSync):
            self.client.model = await self.weights.push(self.model, version)
        else:
            await self.weights.push(self.model, version, written=written, state=state)

    async def failure(self) -> str | None:
        """Why the server can sample no more (its process exited, it does not answer), or None."""
        if self.server is not None and self.server.exited():
            return self.server.exit_reason()
        try:
            await self._served_models()
        except ConfigError:
            return f"the sampler server at {self.url} does not answer"
        return None

    async def aclose(self) -> None:
        await self.client.aclose()
        if self.server is not None:
            await self.server.stop()

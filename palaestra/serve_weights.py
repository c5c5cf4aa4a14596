"""The weight-sync endpoints of ``palaestra serve --enable-weight-sync``: the part of vLLM's API
that the RL trainer's remote sampler uses (``palaestra/train/samplers/sync.py``), so the whole
remote path runs against a server on this machine.

- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``: the served model with that PEFT
  adapter, answering as ``lora_name`` (merged into a copy of the weights: requests to it cost what
  the base model's do).
- ``POST /v1/unload_lora_adapter {"lora_name"}``: that name is no longer served.
- ``POST /collective_rpc {"method": "reload_weights"}``: the weights are read again from the model
  folder the server was started on (every ``*.safetensors`` file), once the requests in flight end.
- ``POST /reset_prefix_cache``: no cached prefix is reused.

Errors are vLLM-like: 400 with an OpenAI error body for a bad request (a name already loaded, a
path that is no adapter, a method other than ``reload_weights``), 404 for an unknown adapter name.
Requests wait while weights are loaded; nothing in flight sees weights change mid-reply.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from palaestra.clients.local import LocalClient
    from palaestra.serve import ChatServer


class WeightSync:
    """The handlers, over the ``ChatServer`` whose base ``LocalClient`` was loaded from ``folder``."""

    def __init__(self, server: ChatServer, folder: str) -> None:
        from palaestra.clients.local import LocalClient

        if not isinstance(server.client, LocalClient):
            raise ValueError(
                "weight sync needs a local model (a LocalClient): it changes the weights in place"
            )
        self.server, self.base, self.folder = server, server.client, Path(folder)
        self.adapters: dict[str, LocalClient] = {}
        self.lock = asyncio.Lock()  # one weight change at a time

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return _error(400, "load_lora_adapter needs 'lora_name' and 'lora_path' (strings)")
        async with self.lock:
            if name in self.server.models:
                return _error(400, f"The lora adapter '{name}' has already been loaded.")
            if not (Path(path) / "adapter_config.json").is_file():
                return _error(400, f"No adapter found at {path} (no adapter_config.json)")
            try:
                client = await asyncio.to_thread(self._with_adapter, name, path)
            except Exception as exc:  # noqa: BLE001 - peft's errors of any kind: the caller's adapter is bad
                return _error(400, f"cannot load the adapter at {path}: {type(exc).__name__}: {exc}")
            self.adapters[name] = client
            self.server.models[name] = client
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    def _with_adapter(self, name: str, path: str) -> LocalClient:
        from peft import PeftModel

        from palaestra.clients.local import LocalClient

        merged = PeftModel.from_pretrained(copy.deepcopy(self.base.hf_model), path).merge_and_unload()
        return LocalClient.from_model(
            merged, self.base.tokenizer, name=name, max_batch_size=self.base.max_batch_size
        )

    async def unload_lora(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = body.get("lora_name")
        async with self.lock:
            if not isinstance(name, str) or name not in self.adapters:
                return _error(404, f"The lora adapter '{name}' cannot be found.")
            client = self.adapters.pop(name)
            del self.server.models[name]
        await client.aclose()  # its requests in flight finish first
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if body.get("method") != "reload_weights":
            return _error(
                400, f"palaestra serve runs only the method 'reload_weights', not {body.get('method')!r}"
            )
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            return _error(400, f"no *.safetensors weights in {self.folder} to reload")
        async with self.lock:
            try:
                state = await asyncio.to_thread(_read_weights, files)
                await self.base.update_weights(state)  # waits for the requests in flight
            except (OSError, KeyError, ValueError) as exc:
                return _error(400, f"cannot reload the weights of {self.folder}: {exc}")
        return web.json_response({"results": [None]})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        for client in {id(c): c for c in self.server.models.values()}.values():
            paused = getattr(client, "paused", None)
            if paused is not None:
                async with paused():  # leaving a pause drops every cached prefix
                    pass
        return web.Response(status=200)


def add_weight_sync(app: web.Application, server: ChatServer, folder: str) -> None:
    """Route the weight-sync endpoints of ``server`` (loaded from ``folder``) on ``app``."""
    sync = WeightSync(server, folder)
    app.router.add_post("/v1/load_lora_adapter", sync.load_lora)
    app.router.add_post("/v1/unload_lora_adapter", sync.unload_lora)
    app.router.add_post("/collective_rpc", sync.collective_rpc)
    app.router.add_post("/reset_prefix_cache", sync.reset_prefix_cache)


def _read_weights(files: list[Path]) -> dict[str, Any]:
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":  # as vLLM's endpoints answer a body sent as anything else
        raise web.HTTPBadRequest(reason="Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(reason="the body is not JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(reason="the body must be a JSON object")
    return body


def _error(status: int, message: str) -> web.Response:
    from palaestra.serve import error_response

    return error_response(status, message)

"""``palaestra serve --enable-weight-sync``: vLLM's weight-sync endpoints over a LocalClient on the
tiny model, driven over real loopback HTTP: adapters load under fresh names and unload, weights
reload from the served folder, and without the flag none of these routes exist."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

import palaestra as pa
from palaestra.serve import create_app, start

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

SEEDED = pa.Sampling(temperature=1.0, max_tokens=6, seed=7, logprobs=True)
HELLO = [{"role": "user", "content": "the cat sat"}]


@pytest_asyncio.fixture
async def served(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """The tiny model's copy, served with weight sync; yields (base URL, its folder)."""
    from palaestra.clients.local import LocalClient

    folder = tmp_path / "served"
    shutil.copytree(tiny_model_dir, folder)
    client = LocalClient(str(folder), name="tiny")
    runner, url = await start(create_app(client, weights_from=str(folder)), "127.0.0.1", 0)
    try:
        yield url, folder
    finally:
        await runner.cleanup()
        await client.aclose()


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        text = await resp.text()
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:
            return resp.status, text


async def chat(url: str, model: str) -> pa.ModelResponse:
    async with pa.OpenAIClient(model, base_url=url, extra_body={"return_token_ids": True}) as client:
        return await client.chat(HELLO, sampling=SEEDED)


def save_adapter(base: Path, path: Path, scale: float) -> None:
    """A LoRA adapter on the model at ``base`` whose B matrices are ``scale`` (not 0: it changes outputs)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(scale)
    model.save_pretrained(path)


async def test_an_adapter_loads_under_its_name_answers_as_it_and_unloads(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, folder = served
    root = url.removesuffix("/v1")
    save_adapter(folder, tmp_path / "adapter", scale=0.5)
    base = await chat(url, "tiny")
    status, _ = await post(
        root + "/v1/load_lora_adapter", {"lora_name": "policy-v1", "lora_path": str(tmp_path / "adapter")}
    )
    assert status == 200
    async with aiohttp.ClientSession() as session, session.get(url + "/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["tiny", "policy-v1"]
    adapted = await chat(url, "policy-v1")
    assert adapted.prompt_token_ids == base.prompt_token_ids and adapted.logprobs != base.logprobs
    assert (await chat(url, "tiny")).logprobs == base.logprobs  # the base model is untouched

    again = await post(
        root + "/v1/load_lora_adapter", {"lora_name": "policy-v1", "lora_path": str(tmp_path / "adapter")}
    )
    assert again[0] == 400 and "already been loaded" in again[1]["error"]["message"]
    nothing = await post(root + "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert nothing[0] == 400 and "No adapter found" in nothing[1]["error"]["message"]

    assert (await post(root + "/v1/unload_lora_adapter", {"lora_name": "policy-v1"}))[0] == 200
    gone = await post(root + "/v1/unload_lora_adapter", {"lora_name": "policy-v1"})
    assert gone[0] == 404 and "cannot be found" in gone[1]["error"]["message"]
    with pytest.raises(pa.ModelHTTPError, match="404"):
        await chat(url, "policy-v1")


async def test_reload_weights_reads_the_served_folder_again(served: tuple[str, Path]) -> None:
    from safetensors.torch import load_file, save_file

    url, folder = served
    root = url.removesuffix("/v1")
    before = await chat(url, "tiny")
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k: v * 1.5 for k, v in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"}
    )
    assert (await chat(url, "tiny")).logprobs == before.logprobs  # nothing changes before the reload
    status, body = await post(root + "/collective_rpc", {"method": "reload_weights"})
    assert status == 200 and body == {"results": [None]}
    assert (await post(root + "/reset_prefix_cache", {}))[0] == 200
    assert (await chat(url, "tiny")).logprobs != before.logprobs

    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    await post(root + "/collective_rpc", {"method": "reload_weights"})
    assert (await chat(url, "tiny")).logprobs == before.logprobs  # the very same weights: the same floats

    other = await post(root + "/collective_rpc", {"method": "sleep"})
    assert other[0] == 400 and "only the method 'reload_weights'" in other[1]["error"]["message"]


async def test_a_body_not_sent_as_json_is_refused_as_vllm_refuses_it(served: tuple[str, Path]) -> None:
    """vLLM's LoRA endpoints answer 400 to a JSON body without ``Content-Type: application/json``;
    so does this stand-in, so the sampler's requests that pass here pass there."""
    url, _ = served
    root = url.removesuffix("/v1")
    body = b'{"lora_name": "x", "lora_path": "/nowhere"}'
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/collective_rpc"):
        async with aiohttp.ClientSession() as session, session.post(root + path, data=body) as resp:
            assert resp.status == 400 and "Only 'application/json' is allowed" in await resp.text()


async def test_without_the_flag_there_are_no_weight_sync_routes(tiny_model_dir: Path) -> None:
    from palaestra.clients.local import LocalClient

    client = LocalClient(str(tiny_model_dir), name="tiny")
    runner, url = await start(create_app(client), "127.0.0.1", 0)
    try:
        root = url.removesuffix("/v1")
        for path in ("/v1/load_lora_adapter", "/collective_rpc", "/reset_prefix_cache"):
            assert (await post(root + path, {}))[0] == 404
        async with aiohttp.ClientSession() as session, session.get(root + "/health") as resp:
            assert resp.status == 200
    finally:
        await runner.cleanup()
        await client.aclose()


def test_weight_sync_needs_a_model_folder(capsys: pytest.CaptureFixture[str]) -> None:
    from palaestra.cli import main

    code = main(["serve", "some-org/some-model", "--enable-weight-sync", "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--enable-weight-sync reloads weights from the model's folder" in err

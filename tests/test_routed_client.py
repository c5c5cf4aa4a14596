"""Several endpoints of one model (``-b URL1,URL2``): a group's requests go to one endpoint, groups
go to the least pending one, and an endpoint that dies (before the run or during it) is drained:
its requests are retried on the others and the run is the one-endpoint run."""

from __future__ import annotations

import socket
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import palaestra as pa
from palaestra.cli import main
from palaestra.cli.common import ClientOptions, make_client
from palaestra.clients.routed import RoutedClient
from palaestra.testing.server import FakeOpenAIServer, echo_reply, served_in_thread

pytest.importorskip("reverse_text")
SPEC = pa.RunSpec(num_examples=16, rollouts_per_example=4, max_concurrent=8, seed=1)


def endpoint(url: str) -> pa.OpenAIClient:
    return pa.OpenAIClient("fake-model", base_url=url, api_key="", max_retries=0)


def free_port_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def prompts(server: FakeOpenAIServer) -> list[str]:
    return [str(body["messages"][-1]["content"]) for body in server.requests]


def comparable(run: pa.EvalRun) -> tuple[Any, list[Any]]:
    summary = {k: v for k, v in run.summary.items() if k != "timing"}
    return summary, [(r.example_id, r.rollout_index, r.reward, r.messages) for r in run.rollouts]


async def evaluate(client: Any) -> pa.EvalRun:
    env = pa.load_environment("reverse_text", num_examples=16)
    try:
        return await pa.evaluate(env, client, SPEC, output_dir=None)
    finally:
        await client.aclose()


async def test_a_groups_requests_go_to_one_endpoint_and_groups_to_the_least_pending() -> None:
    async with FakeOpenAIServer() as a, FakeOpenAIServer() as b:
        run = await evaluate(RoutedClient([endpoint(a.base_url), endpoint(b.base_url)]))
        assert all(r.error is None for r in run.rollouts) and len(run.rollouts) == 64
        where: dict[str, set[str]] = defaultdict(set)
        for name, server in (("a", a), ("b", b)):
            for prompt in prompts(server):
                where[prompt].add(name)
        assert len(where) == 16 and all(len(servers) == 1 for servers in where.values())  # sticky
        assert 16 <= a.request_count <= 48 and a.request_count + b.request_count == 64  # both share the load


async def test_an_endpoint_that_dies_is_drained_and_its_groups_retried_on_the_other() -> None:
    async with FakeOpenAIServer() as alone:
        reference = await evaluate(endpoint(alone.base_url))
    served = 0

    def dies_after_ten(body: dict[str, Any]) -> Any:
        nonlocal served
        served += 1
        return echo_reply(body) if served <= 10 else {"fault": "close"}  # the connection dropped

    async with FakeOpenAIServer() as a, FakeOpenAIServer(dies_after_ten) as b:
        # one endpoint down from the start, one that dies mid-run, one that stays
        routed = RoutedClient([endpoint(free_port_url()), endpoint(b.base_url), endpoint(a.base_url)])
        assert len(await routed.check()) == 1  # the one that is down is named, and drained
        run = await evaluate(routed)
        assert all(r.error is None for r in run.rollouts), [r.error for r in run.rollouts if r.error]
        assert comparable(run) == comparable(reference)
        assert served > 10 and routed.drains >= 1  # b failed requests mid-run, and they moved


def test_the_cli_takes_a_list_of_endpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = ClientOptions(
        "fake-model", base_url="http://127.0.0.1:1/v1, http://127.0.0.1:2/v1", no_api_key=True
    )
    client = make_client(options)
    assert (
        isinstance(client, RoutedClient) and client.base_url == "http://127.0.0.1:1/v1,http://127.0.0.1:2/v1"
    )
    with served_in_thread() as server:
        code = main(
            [
                "eval",
                "reverse_text",
                "-m",
                "fake-model",
                "-b",
                f"{free_port_url()},{server.base_url}",
                "--no-api-key",
                "-n",
                "4",
                "-r",
                "2",
                "--quiet",
                "-o",
                str(tmp_path),
            ]
        )
    err = capsys.readouterr().err
    assert code == 0 and "palaestra: warning: cannot reach http://127.0.0.1:" in err
    (folder,) = (tmp_path / "evals" / "reverse_text--fake-model").iterdir()
    saved = pa.load_run(folder)
    assert len(saved.rollouts) == 8 and all(r.error is None for r in saved.rollouts)
    assert (
        saved.metadata.base_url is not None and saved.metadata.base_url.count(",") == 1
    )  # resume finds both
    assert (
        main(["eval", "reverse_text", "-m", "fake-model", "-b", "http://127.0.0.1:1/v1,", "--no-api-key"])
        == 2
    )
    assert "an empty endpoint in the list" in capsys.readouterr().err

"""The environment server against bad requests, callers that vanish and many episodes at once.

Each class of bad request gets one 4xx with a ``detail`` and a ``code``, and the episode it named
plays on to the reward it would have had. Episodes whose caller went away end after the idle
timeout with the environment's cleanup run, and are released: nothing stays behind.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import pytest
import tictactoe

import palaestra as pa
from palaestra.interop.server import serving


def counting(env: pa.Environment) -> dict[str, int]:
    """Count the episodes whose ``setup_state`` ran and those whose ``cleanup_state`` ran."""
    counts = {"setup": 0, "cleanup": 0}
    setup, cleanup = env.setup_state, env.cleanup_state  # type: ignore[attr-defined]

    async def counted_setup(state: pa.State) -> None:
        counts["setup"] += 1
        await setup(state)

    async def counted_cleanup(state: pa.State) -> None:
        counts["cleanup"] += 1
        await cleanup(state)

    env.setup_state, env.cleanup_state = counted_setup, counted_cleanup  # type: ignore[attr-defined]
    return counts


async def call(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as response:
        return response.status, await response.json()


def move(body: dict[str, Any]) -> dict[str, Any]:
    obs = body["observation"]
    return {"content": tictactoe.optimal_player(obs["messages"], random.Random(obs["sampling"]["seed"]))}


async def test_each_bad_request_is_one_4xx_and_the_episode_plays_on() -> None:
    env = pa.load_environment("tictactoe", num_examples=4)
    clean = await env.run(pa.ScriptedClient(tictactoe.optimal_player), pa.RunSpec(seed=3, num_examples=1))
    async with serving(env, max_body_bytes=10_000) as url, aiohttp.ClientSession() as session:
        refused = {
            "malformed JSON": ("POST", "/reset", {"data": b"{not json"}, 400, "invalid_json"),
            "not an object": ("POST", "/reset", {"json": [1, 2]}, 400, "invalid_request"),
            "unknown field": ("POST", "/reset", {"json": {"sed": 1}}, 400, "invalid_request"),
            "wrong type": ("POST", "/reset", {"json": {"seed": "1"}}, 400, "invalid_request"),
            "bad sampling": ("POST", "/reset", {"json": {"sampling": {"top_p": 2}}}, 400, "invalid_request"),
            "unknown example": ("POST", "/reset", {"json": {"example_id": 4}}, 404, "unknown_example"),
            "unknown episode": (
                "POST",
                "/step",
                {"json": {"episode_id": "x", "action": {"content": "a"}}},
                404,
                "unknown_episode",
            ),
            "state without id": ("GET", "/state", {}, 400, "invalid_request"),
            "step without id": (
                "POST",
                "/step",
                {"json": {"action": {"content": "a"}}},
                400,
                "invalid_request",
            ),
            "unknown route": ("GET", "/nowhere", {}, 404, "not_found"),
            "wrong method": ("GET", "/step", {}, 405, "method_not_allowed"),
            "body too large": ("POST", "/reset", {"data": b" " * 20_000}, 413, "body_too_large"),
            "bad page": ("GET", "/examples", {"params": {"limit": "many"}}, 400, "invalid_request"),
        }
        for what, (method, path, kwargs, status, code) in refused.items():
            got, body = await call(session, method, url + path, **kwargs)
            assert (got, body["code"]) == (status, code), what
            assert body["detail"], what

        status, body = await call(session, "POST", f"{url}/reset", json={"seed": 3, "example_id": 0})
        episode = body["metadata"]["episode_id"]
        status, taken = await call(session, "POST", f"{url}/reset", json={"episode_id": episode})
        assert (status, taken["code"]) == (409, "episode_exists")
        bad_steps = {
            "not the assistant": (
                {"message": {"role": "user", "content": "hi"}},
                None,
                400,
                "invalid_request",
            ),
            "no content": ({"content": None}, None, 400, "invalid_request"),
            "content of a wrong type": ({"content": 3}, None, 400, "invalid_request"),
            "bad tool call": ({"tool_calls": [{"function": "f"}]}, None, 400, "invalid_request"),
            "bad token ids": ({"content": "a", "token_ids": ["1"]}, None, 400, "invalid_request"),
            "unknown action field": ({"content": "a", "move": 1}, None, 400, "invalid_request"),
            "out of order": ({"content": "a"}, 5, 409, "out_of_order"),
        }
        while not body["done"]:
            for what, (act, turn, want, code) in bad_steps.items():
                step = {"episode_id": episode, "action": act, "turn": turn}
                got, refusal = await call(session, "POST", f"{url}/step", json=step)
                assert (got, refusal["code"]) == (want, code), what
            turn = body["observation"]["turn"]
            step = {"episode_id": episode, "action": move(body), "turn": turn}
            status, body = await call(session, "POST", f"{url}/step", json=step)
            assert status == 200, body
        assert body["reward"] == pytest.approx(clean[0].reward)  # the refusals changed nothing
        assert body["observation"]["messages"] == clean[0].messages
        late = {"episode_id": episode, "action": {"content": "<move>4</move>"}}
        status, done = await call(session, "POST", f"{url}/step", json=late)
        assert (status, done["code"]) == (409, "episode_done")
        status, state = await call(session, "GET", f"{url}/state", params={"episode_id": episode})
        assert state["rollout"]["reward"] == pytest.approx(clean[0].reward) and state["step_count"] == len(
            clean[0].turns
        )
        assert (await call(session, "POST", f"{url}/close", json={"episode_id": episode}))[0] == 200
        status, gone = await call(session, "GET", f"{url}/state", params={"episode_id": episode})
        assert (status, gone["code"]) == (410, "episode_released")


async def test_a_second_step_while_one_plays_is_refused() -> None:
    env = pa.load_environment("tictactoe", num_examples=1)
    answered = asyncio.Event()
    respond = env.env_response  # type: ignore[attr-defined]

    async def slow_response(messages: pa.Messages, state: pa.State) -> Any:
        answered.set()
        await asyncio.sleep(0.3)
        return await respond(messages, state)

    env.env_response = slow_response  # type: ignore[attr-defined]
    async with serving(env) as url, aiohttp.ClientSession() as session:
        _, body = await call(session, "POST", f"{url}/reset", json={})
        step = {"episode_id": body["metadata"]["episode_id"], "action": move(body)}
        first = asyncio.create_task(call(session, "POST", f"{url}/step", json=step))
        await answered.wait()
        status, refusal = await call(session, "POST", f"{url}/step", json=step)
        assert (status, refusal["code"]) == (409, "step_in_progress")
        assert (await first)[0] == 200


async def test_capacity_is_a_503_until_an_episode_is_closed() -> None:
    env = pa.load_environment("tictactoe", num_examples=2)
    async with serving(env, max_episodes=2) as url, aiohttp.ClientSession() as session:
        ids = [
            (await call(session, "POST", f"{url}/reset", json={}))[1]["metadata"]["episode_id"]
            for _ in range(2)
        ]
        status, full = await call(session, "POST", f"{url}/reset", json={})
        assert (status, full["code"]) == (503, "capacity")
        await call(session, "POST", f"{url}/close", json={"episode_id": ids[0]})
        assert (await call(session, "POST", f"{url}/reset", json={}))[0] == 200


async def test_an_abandoned_episode_ends_cleans_up_and_is_released() -> None:
    env = pa.load_environment("tictactoe", num_examples=1)
    counts = counting(env)
    async with serving(env, idle_timeout=0.2, keep_finished=0.3) as url, aiohttp.ClientSession() as session:
        _, body = await call(session, "POST", f"{url}/reset", json={})
        episode = body["metadata"]["episode_id"]
        await asyncio.sleep(0.35)  # past the idle timeout, before the release
        _, state = await call(session, "GET", f"{url}/state", params={"episode_id": episode})
        assert state["done"] and state["error"]["type"] == "CallerTimeout"
        assert counts == {"setup": 1, "cleanup": 1}
        await asyncio.sleep(1.2)  # released by the server's sweep, with no request in between
        _, health = await call(session, "GET", f"{url}/health")
        assert health["episodes"]["running"] == health["episodes"]["finished"] == 0
        late = {"episode_id": episode, "action": {"content": "<move>4</move>"}}
        status, gone = await call(session, "POST", f"{url}/step", json=late)
        assert (status, gone["code"]) == (410, "episode_released")


async def test_many_episodes_with_callers_that_vanish_leave_nothing_behind() -> None:
    """300 episodes at once; a third of the callers disappear mid-episode (some mid-request)."""
    env = pa.load_environment("tictactoe", num_examples=50)
    counts = counting(env)
    local = await env.run(pa.ScriptedClient(tictactoe.optimal_player), pa.RunSpec(seed=9))
    expected = {r.example_id: r.reward for r in local}
    rng = random.Random(0)
    connector = aiohttp.TCPConnector(limit=64)
    # the idle timeout ends the vanished callers' episodes; it is long enough that a caller that
    # keeps playing, queued behind 63 others on a loaded machine, is never taken for one of them
    async with serving(env, idle_timeout=3.0, keep_finished=0.3) as url:
        async with aiohttp.ClientSession(connector=connector) as session:

            async def episode(i: int) -> float | None:
                fate = rng.choice(["finish", "finish", "vanish", "cut"])
                _, body = await call(session, "POST", f"{url}/reset", json={"seed": 9, "example_id": i % 50})
                steps = 0
                while not body["done"]:
                    if fate != "finish" and steps == 1:
                        if fate == "cut":  # the connection drops while the step is being played
                            step = {"episode_id": body["metadata"]["episode_id"], "action": move(body)}
                            task = asyncio.create_task(call(session, "POST", f"{url}/step", json=step))
                            await asyncio.sleep(rng.choice([0, 0.002, 0.01]))
                            task.cancel()
                        return None
                    step = {"episode_id": body["metadata"]["episode_id"], "action": move(body)}
                    _, body = await call(session, "POST", f"{url}/step", json=step)
                    steps += 1
                assert body["reward"] == pytest.approx(expected[i % 50])
                return float(body["reward"])

            results = await asyncio.gather(*(episode(i) for i in range(300)), return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)]
            assert 100 < sum(r is not None for r in results) < 300
            for _ in range(100):  # idle timeout, then release
                await asyncio.sleep(0.1)
                _, health = await call(session, "GET", f"{url}/health")
                if health["episodes"]["running"] == health["episodes"]["finished"] == 0:
                    break
            assert health["episodes"] == {"running": 0, "finished": 0, "max": 1024}
    assert counts["setup"] == counts["cleanup"] == 300 + 50
    leftover = [t for t in asyncio.all_tasks() if t.get_name().startswith("episode ")]
    assert leftover == []

"""SQL Quiz: per-rollout databases, read-only tools, execution-match reward, nothing leaked."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
import sql_quiz as sq

import palaestra as pa
from palaestra.testing import FakeOpenAIServer


def database(seconds: float = 2.0, steps: int = 20_000_000) -> sq.Database:
    return sq.open_database(sq.make_shop(random.Random(1)), seconds, steps)


def test_dataset_is_generated_from_the_seed_with_reference_answers() -> None:
    rows = sq.make_dataset(40, seed=0)
    assert rows == sq.make_dataset(40, seed=0) and rows[:5] == sq.make_dataset(5, seed=0)
    assert rows != sq.make_dataset(40, seed=1)
    assert len({r["question"] for r in rows}) > 20
    for row in rows:  # the answer is the reference query run on that example's shop
        conn = sq.open_shop(sq.make_shop(random.Random(row["info"]["shop_seed"])))
        assert sq.canonical(conn.execute(row["info"]["sql"]).fetchall()) == row["answer"] != []
        conn.close()


def test_the_model_may_only_read() -> None:
    db = database()
    assert "CREATE TABLE customers" in sq.list_tables(db)
    assert sq.query("SELECT COUNT(*) AS n FROM customers", db).startswith("n\n")
    for sql in (
        "DELETE FROM orders",
        "DROP TABLE customers",
        "INSERT INTO customers VALUES (99, 'x', 'y')",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA writable_schema = ON",
        "CREATE TABLE t (x)",
    ):
        assert sq.query(sql, db).startswith("SQL error: not authorized"), sql
    assert sq.query("SELECT FROM nowhere", db).startswith("SQL error: near")
    assert sq.query("SELEC nonsense", db).startswith(
        "SQL error: not authorized: SELEC statement; only SELECT"
    )
    assert sq.query("SELECT COUNT(*) FROM orders", db).splitlines()[1] == str(
        db.conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
    )


def test_a_runaway_query_is_stopped() -> None:
    forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT MAX(i) FROM n"
    db = database(seconds=0.2, steps=10**15)
    assert sq.query(forever, db) == "SQL error: the query ran past 0.2 s and was stopped"
    assert "(1 rows)" in sq.query("SELECT 1", db)  # the connection still works
    db = database(seconds=60, steps=100_000)  # steps: the same on any machine
    assert sq.query(forever, db) == "SQL error: the query ran more than 100,000 steps and was stopped"
    assert "(1 rows)" in sq.query("SELECT 1", db)


def test_long_results_are_cut_and_say_so() -> None:
    text = sq.query("SELECT id FROM orders", database())
    assert "... " in text and text.endswith("rows)") and len(text.splitlines()) == 1 + 20 + 2


async def test_the_teacher_scores_one_and_the_sloppy_policy_less() -> None:
    env = sq.load_environment(num_examples=30)
    taught = await env.run(pa.ScriptedClient(sq.teacher))
    assert [r.reward for r in taught] == [1.0] * 30
    assert all(r.metrics["query_calls"] == 1 and r.metrics["list_tables_calls"] == 1 for r in taught)
    sloppy = await env.run(pa.ScriptedClient(sq.sloppy), pa.RunSpec(rollouts_per_example=2))
    mean = sum(r.reward or 0 for r in sloppy) / len(sloppy)
    assert 0.3 < mean < 0.9
    assert env.open_connections == 0


def call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply_for(env: sq.SQLQuizEnv) -> Any:
    """A scripted model over HTTP: bad calls first, then a good query, then the answer."""
    sql_of = {e.prompt[-1]["content"]: e.row["info"]["sql"] for e in env.examples}

    def reply(body: dict[str, Any]) -> Any:
        messages = body["messages"]
        sql = sql_of[next(m["content"] for m in messages if m["role"] == "user")]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == 0:
            return {
                "content": None,
                "tool_calls": [
                    call("list_tables", "{}", "a"),
                    call("query", '{"sql": ', "b"),  # malformed JSON
                    call("query", '{"query": "SELECT 1"}', "c"),  # wrong argument name
                    call("drop_table", "{}", "d"),  # no such tool
                    call("query", json.dumps({"sql": sql}), "e"),
                ],
            }
        return f"The answer comes from <sql>{sql}</sql>"

    return reply


async def test_end_to_end_through_the_openai_api_with_bad_calls() -> None:
    env = sq.load_environment(num_examples=4)
    async with FakeOpenAIServer(reply_for(env)) as server:
        client = pa.OpenAIClient(server.model, base_url=server.base_url, max_retries=0)
        async with client:
            rollouts = await env.run(client, pa.RunSpec(rollouts_per_example=2, max_concurrent=4))
    assert [r.reward for r in rollouts] == [1.0] * 8 and env.open_connections == 0
    tools = [m for m in rollouts[0].completion if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["a", "b", "c", "d", "e"]
    assert tools[1]["content"].startswith("Error: the arguments are not valid JSON")
    assert "missing required argument 'sql'" in tools[2]["content"]
    assert "unknown argument 'query'" in tools[2]["content"]
    assert tools[3]["content"].startswith("Error: unknown tool 'drop_table'")
    assert rollouts[0].metrics["tool_errors"] == 3 and rollouts[0].metrics["query_calls"] == 3
    # the schemas sent say nothing of the hidden database argument
    sent = {t["function"]["name"]: t["function"]["parameters"] for t in server.requests[0]["tools"]}
    assert sent["query"]["properties"].keys() == {"sql"} and sent["list_tables"]["properties"] == {}


async def test_a_wrong_or_missing_final_query_scores_zero() -> None:
    env = sq.load_environment(num_examples=3)
    replies = ["<sql>SELECT name FROM nowhere</sql>", "no tags at all", "<sql>SELECT 12345</sql>"]
    answer = {e.prompt[-1]["content"]: reply for e, reply in zip(env.examples, replies, strict=True)}
    rollouts = await env.run(pa.ScriptedClient(lambda messages: answer[messages[-1]["content"]]))
    assert [r.reward for r in rollouts] == [0.0, 0.0, 0.0]
    assert rollouts[0].state["answer_error"].startswith("OperationalError: no such table")
    assert rollouts[1].state["answer_error"] == "no <sql> query in the final reply"
    assert rollouts[2].metrics["valid_sql"] == 1.0 and rollouts[2].state["result"] == [[12345.0]]


async def test_no_connection_is_left_open_after_a_cancelled_run() -> None:
    env = sq.load_environment(num_examples=4)
    first_turn = reply_for(env)

    def reply(body: dict[str, Any]) -> Any:  # every second turn hangs, whatever order requests arrive in
        answered = any(m["role"] == "assistant" for m in body["messages"])
        return {"fault": "hang"} if answered else first_turn(body)

    async with FakeOpenAIServer(reply) as server:
        client = pa.OpenAIClient(server.model, base_url=server.base_url, max_retries=0)
        async with client:
            task = asyncio.create_task(env.run(client, pa.RunSpec(rollouts_per_example=2)))
            async with asyncio.timeout(30):
                while server.request_count < 16:  # every rollout holds its database, waiting on the model
                    await asyncio.sleep(0.01)
            assert env.open_connections == 8
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert env.open_connections == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"num_examples": 0}, "num_examples must be an integer ≥ 1"),
        ({"max_turns": "3"}, "max_turns must be an integer"),
        ({"query_seconds": 0}, "query_seconds must be a number ≥ 0.01"),
    ],
)
def test_bad_arguments_are_refused(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pa.load_environment("sql_quiz", **args)

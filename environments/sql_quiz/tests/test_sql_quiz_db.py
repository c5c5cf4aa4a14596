"""SQL Quiz's locked-down database: an allow-list of what SQL may do, and bounded queries and results."""

from __future__ import annotations

import random
import sqlite3

import pytest
import sql_quiz as sq
import sql_quiz_db

import palaestra as pa


def database(seconds: float = 2.0, steps: int = 20_000_000) -> sq.Database:
    return sq.open_database(sq.make_shop(random.Random(1)), seconds, steps)


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("SELECT fts3_tokenizer('simple')", "not authorized to use function: fts3_tokenizer"),  # a pointer
        ("SELECT hex(fts3_tokenizer('simple'))", "not authorized to use function: fts3_tokenizer"),
        ("SELECT load_extension('/tmp/x.so')", "not authorized to use function: load_extension"),
        ("SELECT sqlite_version()", "not authorized to use function: sqlite_version"),
        ("SELECT sqlite_compileoption_get(0)", "not authorized to use function: sqlite_compileoption_get"),
        ("SELECT sqlite_source_id()", "not authorized to use function: sqlite_source_id"),
        ("SELECT random()", "not authorized to use function: random"),
        ("SELECT zeroblob(1000000000)", "not authorized to use function: zeroblob"),
        ("SELECT * FROM dbstat", "dbstat"),  # page layout of the database
        ("SELECT * FROM pragma_function_list", "not authorized"),
        ("SELECT * FROM json_each('[1]')", "json_each"),
        ("ATTACH DATABASE '/tmp/other.db' AS other", "not authorized"),
        ("VACUUM INTO '/tmp/copy.db'", "not authorized"),
        ("DETACH DATABASE main", "not authorized"),
        ("PRAGMA query_only = OFF", "not authorized"),
        ("PRAGMA journal_mode", "not authorized"),
        ("PRAGMA writable_schema = ON", "not authorized"),
        ("UPDATE products SET price = 0", "not authorized"),
        ("DELETE FROM orders", "not authorized"),
        ("INSERT INTO customers VALUES (99, 'x', 'y')", "not authorized"),
        ("CREATE TEMP TABLE t (x)", "not authorized"),
        ("CREATE TEMP VIEW v AS SELECT 1", "not authorized"),
        ("BEGIN", "not authorized"),
        ("ANALYZE", "not authorized"),
        ("REINDEX", "not authorized"),
    ],
)
def test_the_allow_list_refuses_what_a_quiz_does_not_need(sql: str, error: str) -> None:
    db = database()
    out = sq.query(sql, db)
    assert out.startswith("SQL error:") and error in out, out
    assert sq.query("SELECT COUNT(*) FROM customers", db).splitlines()[1].isdigit()  # still usable


def test_the_authorizer_refuses_writes_by_itself() -> None:
    conn = database().conn  # below Database.run's check of the statement's first word
    for sql in (
        "ATTACH ':memory:' AS x",
        "VACUUM INTO '/tmp/copy.db'",
        "DELETE FROM orders",
        "PRAGMA query_only = 0",
    ):
        with pytest.raises(sqlite3.DatabaseError, match=r"not authorized|authorization denied"):
            conn.execute(sql)
    assert conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] > 0


def test_a_function_the_connection_gains_is_refused_too() -> None:
    db = database()  # what an extension or another SQLite build would add: not on the allow-list
    db.conn.create_function("readfile", 1, lambda path: open(path).read())
    db.conn.create_function("writefile", 2, lambda path, data: len(data))
    for sql in ("SELECT readfile('/etc/hostname')", "SELECT writefile('/tmp/x', 'data')"):
        assert sq.query(sql, db).startswith("SQL error: not authorized to use function: "), sql


def test_what_a_quiz_needs_is_allowed() -> None:
    db = database()
    allowed = {
        "PRAGMA table_info(orders)": "cid | name | type",
        "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name": "customers",
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 5) SELECT COUNT(*) FROM n": "5",
        "SELECT c.name, RANK() OVER (ORDER BY COUNT(*) DESC) FROM customers c JOIN orders o "
        "ON o.customer_id = c.id GROUP BY c.id LIMIT 1": "(1 rows)",
        "SELECT ROUND(AVG(price), 2), MAX(price), group_concat(DISTINCT category) FROM products": "(1 rows)",
        "SELECT UPPER(SUBSTR(name, 1, 3)) || '-' || printf('%03d', id), strftime('%Y', '2024-01-02') "
        "FROM customers WHERE name LIKE '%a%' OR name GLOB '*e*' LIMIT 1": "2024",
        """SELECT json_object('n', 2) ->> '$.n'""": "\n2\n",
    }
    for sql, expected in allowed.items():
        out = sq.query(sql, db)
        assert not out.startswith("SQL error") and expected in out, (sql, out)


def test_every_bundled_question_runs_its_reference_query_on_the_locked_database() -> None:
    rows = sq.make_dataset(500, seed=0)  # what load_environment() asks
    assert len({row["info"]["sql"].split(" WHERE ")[0] for row in rows}) >= 8  # every template
    for row in rows:
        db = sq.open_database(sq.make_shop(random.Random(row["info"]["shop_seed"])), 2.0, 20_000_000)
        result = db.run(row["info"]["sql"], keep=sq.MAX_ANSWER_ROWS, count_up_to=sq.MAX_ANSWER_ROWS)
        assert sq.canonical(result.rows) == row["answer"], row
        db.conn.close()


def test_results_and_values_are_bounded() -> None:
    db = database()
    out = sq.query("SELECT printf('%.*c', 50000, 'x') AS big", db)  # within the value limit: cut
    line = out.splitlines()[1]
    assert line == "x" * 200 + "... (49,800 more characters)" and out.endswith("(1 rows)")
    assert sq.query("SELECT printf('%.*c', 5000000, 'x')", db).splitlines()[1] == "None"  # past it
    with pytest.raises(sqlite3.DataError):  # a value past the limit is never built
        db.run("SELECT replace(printf('%.*c', 90000, 'x'), 'x', 'yy')", keep=1, count_up_to=1)
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n"
    out = sq.query(endless, db)  # the first rows, counted up to a limit: not every row it would give
    assert out.endswith(f"(more than {sq.MAX_ROWS_COUNTED} rows; the first 20 shown)")
    assert len(out.splitlines()) == 1 + 20 + 2
    wide = "SELECT " + ", ".join(f"printf('%.*c', 90000, 'x') AS c{i}" for i in range(30))
    with pytest.raises(sqlite3.OperationalError, match="larger than 2,000,000 bytes"):
        db.run(wide, keep=10, count_up_to=10)
    assert sql_quiz_db.LIMITS[sqlite3.SQLITE_LIMIT_LENGTH] == db.conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)


async def test_a_final_query_that_is_huge_or_binary_is_scored_not_crashed() -> None:
    env = sq.load_environment(num_examples=3)
    replies = [
        "<sql>SELECT a.id FROM orders a, orders b, orders c</sql>",  # more rows than any answer
        "<sql>SELECT x'00ff', 1e999</sql>",  # a blob and an infinity: saved as JSON text
        "<sql>SELECT fts3_tokenizer('simple')</sql>",
    ]
    answer = {e.prompt[-1]["content"]: reply for e, reply in zip(env.examples, replies, strict=True)}
    rollouts = await env.run(pa.ScriptedClient(lambda messages: answer[messages[-1]["content"]]))
    assert [r.error for r in rollouts] == [None, None, None] and [r.reward for r in rollouts] == [0.0] * 3
    assert rollouts[0].state["answer_error"] == f"the final query returns more than {sq.MAX_ANSWER_ROWS} rows"
    assert rollouts[1].state["result"] == [["X'00FF'", "inf"]]
    assert "not authorized to use function: fts3_tokenizer" in rollouts[2].state["answer_error"]
    assert env.open_connections == 0

"""SQL Quiz: answer questions about a shop's database by querying it, read-only, with tools.

A ``StatefulToolEnv``: every rollout gets its own in-memory SQLite database, filled with a shop's
customers, products and orders generated from the example's seed (all rollouts of one example
see the same data; examples differ). The model explores it with ``list_tables()`` and
``query(sql)``, then gives its final query inside ``<sql>...</sql>``. The reward is execution
match: 1.0 when that query's result set equals the reference query's (rows compared as a
multiset, order ignored, numbers rounded to 2 decimals).

The model's connection is locked down (``sql_quiz_db``): an SQLite authorizer allows an allow-list
only (reading the shop's tables, the SQL functions a quiz needs, a few schema pragmas; no
writes, ``ATTACH``, extensions or functions that show the process's internals), values and
statements are size-limited, and each statement runs at most ``query_steps`` virtual-machine
steps and ``query_seconds``. ``teacher`` and ``sloppy`` are scripted policies:
``palaestra eval sql_quiz -m scripted:sql_quiz:teacher``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sqlite3
from collections import Counter
from typing import Any

from sql_quiz_db import STEP_CHUNK, Database, lock_down

import palaestra as pa
from palaestra.checks import check_int, check_number

SYSTEM_PROMPT = (
    "You answer questions about a shop's SQLite database. Use the tools: list_tables() shows the "
    "tables and their columns; query(sql) runs one read-only SELECT statement and shows its result. "
    "When you know the answer, reply without a tool call and give one final SQL query whose result "
    "answers the question, inside <sql>...</sql> tags."
)

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
                     day INTEGER NOT NULL);
"""
FIRST = "Ada Ben Cleo Dev Eli Fay Gus Hana Ivo Jun Kai Lena Milo Nia Omar Pia Quin Rosa Sven Tara".split()
LAST = "Ames Brook Cole Dunn Eck Ford Gale Hart Ives Jade Knox Lund Moss Nash".split()
CITIES = "Lisbon Oslo Porto Quito Riga Tunis Vigo".split()
CATEGORIES = {
    "tools": "hammer wrench saw drill pliers chisel".split(),
    "garden": "rake hose spade shears trowel".split(),
    "kitchen": "kettle whisk ladle skillet grater".split(),
    "office": "stapler binder marker folder tape".split(),
}
MAX_ROWS_SHOWN = 20
MAX_CELL_CHARS = 200  # of one value in a query's output
MAX_ROWS_COUNTED = 10_000  # a query's output counts its rows up to this
MAX_ANSWER_ROWS = 1_000  # a final query with more rows is wrong anyway


def make_shop(rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    """Rows of the three tables, drawn from ``rng``: 8-14 customers, 8-14 products, 20-60 orders."""
    names = rng.sample([f"{f} {s}" for f in FIRST for s in LAST], rng.randint(8, 14))
    customers = [(i + 1, name, rng.choice(CITIES)) for i, name in enumerate(names)]
    items = [(cat, item) for cat, things in CATEGORIES.items() for item in things]
    chosen = rng.sample(items, rng.randint(8, 14))
    prices = rng.sample(range(200, 9000), len(chosen))  # distinct: "the most expensive" is one product
    products = [
        (i + 1, item, cat, price / 100)
        for i, ((cat, item), price) in enumerate(zip(chosen, prices, strict=True))
    ]
    orders = [
        (
            i + 1,
            rng.randint(1, len(customers)),
            rng.randint(1, len(products)),
            rng.randint(1, 5),
            rng.randint(1, 30),
        )
        for i in range(rng.randint(20, 60))
    ]
    return {"customers": customers, "products": products, "orders": orders}


def open_shop(shop: dict[str, list[tuple[Any, ...]]]) -> sqlite3.Connection:
    """A new in-memory database holding ``shop`` (writable: the caller locks it down)."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.executescript(SCHEMA)
    for table, rows in shop.items():
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    return conn


def open_database(shop: dict[str, list[tuple[Any, ...]]], seconds: float, steps: int) -> Database:
    """A new database holding ``shop``, locked down for the model."""
    return Database(lock_down(open_shop(shop)), seconds, steps)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def make_question(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str]:
    """A (question, reference SQL) pair about the shop in ``conn``, chosen with ``rng``; its
    answer is never empty."""

    def one(sql: str) -> list[Any]:
        return [row[0] for row in conn.execute(sql)]

    city = rng.choice(one("SELECT DISTINCT city FROM customers ORDER BY city"))
    category = rng.choice(one("SELECT DISTINCT category FROM products ORDER BY category"))
    customer = rng.choice(
        one("SELECT name FROM customers WHERE id IN (SELECT customer_id FROM orders) ORDER BY id")
    )
    product = rng.choice(
        one("SELECT name FROM products WHERE id IN (SELECT product_id FROM orders) ORDER BY id")
    )
    day = rng.choice(one("SELECT DISTINCT day FROM orders ORDER BY day"))
    templates = [
        (
            f"How many customers live in {city}?",
            f"SELECT COUNT(*) FROM customers WHERE city = {_quote(city)}",
        ),
        (
            "What is the name of the most expensive product?",
            "SELECT name FROM products ORDER BY price DESC LIMIT 1",
        ),
        (
            f"List the names of the products in the category '{category}'.",
            f"SELECT name FROM products WHERE category = {_quote(category)}",
        ),
        (
            f"What is the total quantity of items ordered by {customer}?",
            "SELECT SUM(o.quantity) FROM orders o JOIN customers c ON c.id = o.customer_id "
            f"WHERE c.name = {_quote(customer)}",
        ),
        (f"How many orders were placed on day {day}?", f"SELECT COUNT(*) FROM orders WHERE day = {day}"),
        (
            f"List the names of the customers who ordered the product '{product}'.",
            "SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id "
            f"JOIN products p ON p.id = o.product_id WHERE p.name = {_quote(product)}",
        ),
        (
            f"What is the total revenue (price times quantity) of the orders in the category '{category}'?",
            "SELECT ROUND(SUM(p.price * o.quantity), 2) FROM orders o JOIN products p ON p.id = o.product_id "
            f"WHERE p.category = {_quote(category)}",
        ),
        (
            "Which customers placed no order at all? List their names.",
            "SELECT name FROM customers WHERE id NOT IN (SELECT customer_id FROM orders)",
        ),
    ]
    rng.shuffle(templates)  # the first whose answer is not empty: an empty result is too easy to match
    return next(((q, sql) for q, sql in templates if conn.execute(sql).fetchone() not in (None, (None,))))


def canonical(rows: list[tuple[Any, ...]] | list[list[Any]]) -> list[list[Any]]:
    """Rows in a comparable form that JSON holds: numbers rounded to 2 decimals (ints as floats;
    infinities as text), blobs as their hex literal, sorted."""

    def cell(value: Any) -> Any:
        if isinstance(value, bytes):
            return f"X'{value.hex().upper()}'"
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return round(float(value), 2)
        return value

    return sorted(([cell(v) for v in row] for row in rows), key=json.dumps)


def make_dataset(num_examples: int, seed: int) -> list[dict[str, Any]]:
    """Rows of ``question``, ``answer`` (the reference result set, canonical) and ``info``
    (``shop_seed``, ``sql``). Row ``i`` depends only on (``seed``, ``i``)."""
    rows = []
    for i in range(num_examples):
        shop_seed = pa.derive_seed("sql_quiz", seed, i)
        rng = random.Random(shop_seed)
        conn = open_shop(make_shop(rng))
        try:
            question, sql = make_question(rng, conn)
            answer = canonical(conn.execute(sql).fetchall())
        finally:
            conn.close()
        rows.append({"question": question, "answer": answer, "info": {"shop_seed": shop_seed, "sql": sql}})
    return rows


def list_tables(db: Database) -> str:
    """Show the database's tables and their columns (their CREATE statements)."""
    sql = "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
    return "\n".join(row[0] for row in db.run(sql, keep=100, count_up_to=100).rows)


def query(sql: str, db: Database) -> str:
    """Run one read-only SQL statement and show its result (at most 20 rows).

    Args:
        sql: A single SELECT statement, in SQLite's dialect.
    """
    try:
        result = db.run(sql, keep=MAX_ROWS_SHOWN, count_up_to=MAX_ROWS_COUNTED, cell_chars=MAX_CELL_CHARS)
    except sqlite3.Error as exc:
        return f"SQL error: {exc}"
    lines = [" | ".join(result.columns)] + [" | ".join(str(v) for v in row) for row in result.rows]
    shown = len(result.rows)
    if result.more:
        return "\n".join(lines) + f"\n... more rows\n(more than {result.count} rows; the first {shown} shown)"
    more = f"\n... {result.count - shown} more rows" if result.count > shown else ""
    return "\n".join(lines) + more + f"\n({result.count} rows)"


class SQLQuizEnv(pa.StatefulToolEnv):
    """The environment; ``open_connections`` counts the databases open now (0 between runs)."""

    def __init__(self, *, query_seconds: float = 2.0, query_steps: int = 20_000_000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.query_seconds = query_seconds
        self.query_steps = query_steps
        self.open_connections = 0
        self.add_tool(list_tables, hidden=["db"])
        self.add_tool(query, hidden=["db"])

    async def setup_state(self, state: pa.State) -> None:
        shop = make_shop(random.Random(state.example.info["shop_seed"]))
        db = await asyncio.to_thread(open_database, shop, self.query_seconds, self.query_steps)
        self.open_connections += 1
        state.resources["db"] = db

    async def cleanup_state(self, state: pa.State) -> None:
        db = state.resources.pop("db", None)
        if db is not None:
            db.conn.close()
            self.open_connections -= 1

    @pa.stop(priority=10)
    async def answered(self, messages: pa.Messages, state: pa.State) -> bool:
        """A reply without tool calls is the answer: run its <sql> query now, while the database is open."""
        last = messages[-1] if messages else {}
        if last.get("role") != "assistant" or last.get("tool_calls"):
            return False
        sql = self.parser.parse_answer([last])
        if not sql:
            state["answer_error"] = "no <sql> query in the final reply"
            return True
        run = state.resources["db"].run
        try:
            result = await asyncio.to_thread(run, sql, keep=MAX_ANSWER_ROWS, count_up_to=MAX_ANSWER_ROWS)
        except sqlite3.Error as exc:
            state["answer_error"] = f"{type(exc).__name__}: {exc}"
            return True
        if result.more:
            state["answer_error"] = f"the final query returns more than {MAX_ANSWER_ROWS} rows"
            return True
        state["result"] = canonical(result.rows)
        return True


def execution_match(state: pa.State, answer: list[list[Any]]) -> float:
    """1.0 when the final query's result set equals the reference's (as a multiset of rows)."""
    result = state.get("result")
    return float(result is not None and Counter(map(json.dumps, result)) == Counter(map(json.dumps, answer)))


def valid_sql(state: pa.State) -> float:
    """1.0 when the final reply held a query that ran."""
    return float("result" in state)


def load_environment(
    num_examples: int = 500,
    seed: int = 0,
    max_turns: int = 8,
    query_seconds: float = 2.0,
    query_steps: int = 20_000_000,
) -> SQLQuizEnv:
    """The SQL Quiz with ``num_examples`` questions generated from ``seed``."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("seed", seed)
    check_int("max_turns", max_turns, minimum=1)
    check_number("query_seconds", query_seconds, low=0.01)
    check_int("query_steps", query_steps, minimum=STEP_CHUNK)
    parser = pa.XMLParser(["sql"])
    rubric = pa.Rubric(parser=parser)
    rubric.add(execution_match, weight=1.0)
    rubric.add(valid_sql, weight=0.0)
    return SQLQuizEnv(
        dataset=make_dataset(num_examples, seed),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
        query_seconds=query_seconds,
        query_steps=query_steps,
        tool_timeout=10.0,
    )


# Scripted policies: ``ScriptedClient(policy)`` plays them as the model.

_REFERENCE: dict[str, str] = {}


def _reference_sql(question: str) -> str:
    """The reference query of a generated question (how a perfect student would write it)."""
    if not _REFERENCE:
        for row in make_dataset(2000, 0):
            _REFERENCE[row["question"]] = row["info"]["sql"]
    if question not in _REFERENCE:  # another seed's question: make its shape's query from its text
        raise KeyError(f"the teacher knows the questions of dataset seed 0 only: {question!r}")
    return _REFERENCE[question]


def _question(messages: pa.Messages) -> str:
    return next(str(m.get("content") or "") for m in messages if m.get("role") == "user")


def teacher(messages: pa.Messages) -> dict[str, Any] | str:
    """Looks at the tables, tries its query, then answers with it: a demonstration for SFT."""
    sql = _reference_sql(_question(messages))
    calls = sum(1 for m in messages if m.get("role") == "assistant")
    if calls == 0:
        return {
            "content": "Let me look at the tables and try a query.",
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "list_tables", "arguments": "{}"}},
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "query", "arguments": json.dumps({"sql": sql})},
                },
            ],
        }
    return f"<sql>{sql}</sql>"


def sloppy(messages: pa.Messages, rng: random.Random) -> str:
    """Answers at once, without looking; its query drops the filter half the time."""
    sql = _reference_sql(_question(messages))
    if rng.random() < 0.5:
        sql = re.sub(r" WHERE .*$", "", sql)
    return f"<sql>{sql}</sql>"

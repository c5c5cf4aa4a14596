"""SQL Quiz's database as the model gets it: locked down to an allow-list, with a budget per statement.

``lock_down(conn)`` makes a connection read-only (``PRAGMA query_only`` and an authorizer that
allows only reading the shop's tables, the SQL functions a quiz needs and a few schema pragmas:
no writes, ``ATTACH``, ``load_extension``, ``fts3_tokenizer`` or other function that shows the
process's internals) and sets SQLite limits on the size of values, statements and results.
``Database.run`` runs one statement within a budget of virtual-machine steps and seconds (so a
``WITH RECURSIVE`` that never ends is stopped) and keeps only the rows it is asked for.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# What the model's statements may do (``authorize``); anything else is "not authorized".
TABLES = frozenset({"customers", "products", "orders", "sqlite_master", "sqlite_schema"})
FUNCTIONS = frozenset(
    """abs char coalesce concat concat_ws format glob hex ifnull iif instr length like likelihood
    likely lower ltrim max min nullif octet_length printf quote replace round rtrim sign soundex
    substr substring trim typeof unicode unlikely upper
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10
    log2 mod pi pow power radians sin sinh sqrt tan tanh trunc
    avg count group_concat string_agg sum total
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    date time datetime julianday strftime unixepoch timediff current_date current_time current_timestamp
    json json_array json_array_length json_extract json_object json_quote json_type json_valid
    json_group_array json_group_object -> ->>""".split()
)
STATEMENTS = frozenset({"select", "with", "values", "explain", "pragma"})  # by their first word
PRAGMAS = frozenset({"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo"})
LIMITS = {  # sqlite3 limits of the model's connection: no value, statement or result of runaway size
    sqlite3.SQLITE_LIMIT_LENGTH: 100_000,  # bytes in a string, blob or row
    sqlite3.SQLITE_LIMIT_SQL_LENGTH: 100_000,
    sqlite3.SQLITE_LIMIT_COLUMN: 100,
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 1_000,
    sqlite3.SQLITE_LIMIT_ATTACHED: 0,
}
_FIRST_WORD = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*(\w*)", re.DOTALL)  # past comments
MAX_KEPT_BYTES = 2_000_000  # of the rows one statement keeps in memory
STEP_CHUNK = 10_000  # virtual-machine steps between two checks of a statement's budget


def authorize(action: int, arg1: str | None, arg2: str | None, database: str | None, *_: Any) -> int:
    """The SQLite authorizer of the model's connection: the allow-list above, nothing else."""
    if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_READ and database is None:  # a CTE's or a subquery's rows
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_READ:  # (table, column)
        name, allowed = arg1, TABLES
    elif action == sqlite3.SQLITE_FUNCTION:  # (None, function)
        name, allowed = arg2, FUNCTIONS
    elif action == sqlite3.SQLITE_PRAGMA:  # (pragma, argument)
        name, allowed = arg1, PRAGMAS
    else:  # writes, ATTACH, transactions, CREATE, ...
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if (name or "").lower() in allowed else sqlite3.SQLITE_DENY


def lock_down(conn: sqlite3.Connection) -> sqlite3.Connection:
    """Make ``conn`` the model's: read-only (``query_only`` and ``authorize``), size-limited."""
    conn.execute("PRAGMA query_only = ON")
    for limit, value in LIMITS.items():
        conn.setlimit(limit, value)
    conn.set_authorizer(authorize)
    return conn


@dataclass
class Result:
    """What a statement returned: its columns, the first rows kept, how many rows it had (counted
    up to a limit; ``more`` when it has more)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    count: int
    more: bool = False


def _cell(value: Any, chars: int | None) -> Any:
    if chars is None or not isinstance(value, str | bytes) or len(value) <= chars:
        return value
    text = str(value)[:chars]
    return f"{text}... ({len(value) - chars:,} more {'bytes' if isinstance(value, bytes) else 'characters'})"


@dataclass
class Database:
    """One rollout's locked-down database, used by one thread at a time; each statement runs at
    most ``steps`` virtual-machine steps and ``seconds``."""

    conn: sqlite3.Connection
    seconds: float
    steps: int = 20_000_000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, sql: str, *, keep: int, count_up_to: int, cell_chars: int | None = None) -> Result:
        """Run one statement; keep its first ``keep`` rows (values cut to ``cell_chars``) and count
        them up to ``count_up_to``. ``sqlite3.Error`` if it fails or runs out of its budget."""
        first = _FIRST_WORD.match(sql)
        word = first.group(1) if first is not None else ""
        if word.lower() not in STATEMENTS:
            raise sqlite3.OperationalError(
                f"not authorized: {word.upper()[:20] or 'this'} statement; only SELECT (WITH, VALUES), "
                "EXPLAIN and schema PRAGMA statements run here"
            )
        with self.lock:
            deadline, checks, stopped = time.monotonic() + self.seconds, 0, ""

            def progress() -> bool:
                nonlocal checks, stopped
                checks += 1
                if checks * STEP_CHUNK > self.steps:
                    stopped = f"ran more than {self.steps:,} steps"
                elif time.monotonic() > deadline:
                    stopped = f"ran past {self.seconds:g} s"
                return bool(stopped)

            self.conn.set_progress_handler(progress, STEP_CHUNK)
            cursor = None
            try:
                cursor = self.conn.execute(sql)
                result, size = Result([d[0] for d in cursor.description or ()], [], 0), 0
                for row in cursor:
                    if result.count == count_up_to:
                        result.more = True
                        break
                    result.count += 1
                    if len(result.rows) < keep:
                        row = tuple(_cell(v, cell_chars) for v in row)
                        size += sum(len(v) if isinstance(v, str | bytes) else 8 for v in row)
                        if size > MAX_KEPT_BYTES:
                            raise sqlite3.OperationalError(
                                f"the result is larger than {MAX_KEPT_BYTES:,} bytes"
                            )
                        result.rows.append(row)
                return result
            except sqlite3.OperationalError as exc:
                if stopped and "interrupted" in str(exc):
                    raise sqlite3.OperationalError(f"the query {stopped} and was stopped") from None
                raise
            finally:
                if cursor is not None:
                    cursor.close()
                self.conn.set_progress_handler(None, 0)

"""The catalog's SQLite file apart from its queries: schema, migrations, connections, transactions."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    """
    CREATE TABLE users (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL
    );
    CREATE TABLE tokens (
        id INTEGER PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES users(id),
        sha256 TEXT NOT NULL UNIQUE,
        label TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        revoked_at TEXT
    );
    CREATE TABLE projects (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        display_name TEXT NOT NULL,
        owner_id INTEGER NOT NULL REFERENCES users(id),
        created_at TEXT NOT NULL
    );
    CREATE TABLE releases (
        id INTEGER PRIMARY KEY,
        project_id INTEGER NOT NULL REFERENCES projects(id),
        version TEXT NOT NULL,
        info TEXT NOT NULL,
        yanked INTEGER NOT NULL DEFAULT 0,
        yanked_reason TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        UNIQUE (project_id, version)
    );
    CREATE TABLE files (
        id INTEGER PRIMARY KEY,
        release_id INTEGER NOT NULL REFERENCES releases(id),
        filename TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        size INTEGER NOT NULL,
        metadata_sha256 TEXT NOT NULL,
        requires_python TEXT NOT NULL DEFAULT '',
        eval_defaults TEXT NOT NULL DEFAULT '{}',
        uploader_id INTEGER NOT NULL REFERENCES users(id),
        uploaded_at TEXT NOT NULL
    );
    CREATE TABLE results (
        id INTEGER PRIMARY KEY,
        project_id INTEGER NOT NULL REFERENCES projects(id),
        env_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        model TEXT NOT NULL,
        version TEXT NOT NULL DEFAULT '',
        run TEXT NOT NULL,
        has_report INTEGER NOT NULL DEFAULT 0,
        uploader_id INTEGER NOT NULL REFERENCES users(id),
        uploaded_at TEXT NOT NULL,
        UNIQUE (project_id, run_id, uploader_id)
    );
    CREATE INDEX results_by_env ON results (env_id);
    """,
)


class CatalogError(Exception):
    """A request the catalog refuses; ``status`` is the HTTP status the server answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Database:
    """The SQLite file at ``path``, created and migrated on open; the catalog's queries are ``Catalog``'s.

    Its schema carries a version (``PRAGMA user_version``) and is brought up to date by
    ``MIGRATIONS`` when opened, so a hub's data folder survives upgrades of palaestra; a database
    made by a newer palaestra is refused rather than guessed at.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        db = self._db()
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise CatalogError(
                500,
                f"{path} has schema version {version}; this palaestra knows up to {len(MIGRATIONS)}: "
                "upgrade palaestra to serve it",
            )
        for number in range(version, len(MIGRATIONS)):
            # one script, one transaction: a migration and its version number land together or not at all
            try:
                db.executescript(
                    f"BEGIN IMMEDIATE; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;"
                )
            except sqlite3.Error:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return int(self._db().execute("PRAGMA user_version").fetchone()[0])

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA synchronous = FULL")
            self._local.db = db
        return db

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A transaction holding SQLite's write lock from its first statement; rolled back on error."""
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

"""The hub's catalog: users, API tokens, projects, releases, files and attached eval results.

One SQLite file. Its schema carries a version (``PRAGMA user_version``) and is brought up to date
by ``MIGRATIONS`` when opened, so a hub's data folder survives upgrades of palaestra; a database
made by a newer palaestra is refused rather than guessed at. Only a token's sha256 is stored: a
token is 256 random bits, so a fast hash is enough and a stolen database reveals no token.

Every method is synchronous and short; the server calls them through ``asyncio.to_thread``.
Writes take SQLite's write lock up front (``BEGIN IMMEDIATE``) so two uploads of one version
cannot both pass the "does it exist?" check.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from palaestra.hub.dist import DistInfo
from palaestra.hub.results import stored_record

TOKEN_PREFIX = "pah_"

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


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class User:
    id: int
    name: str


class Catalog:
    """The SQLite catalog at ``path`` (created and migrated on open)."""

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

    # users and tokens

    def add_user(self, name: str) -> User:
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise CatalogError(400, f"user name {name!r}: use letters, digits, '-' and '_'")
        with self._write() as db:
            try:
                cur = db.execute("INSERT INTO users (name, created_at) VALUES (?, ?)", (name, _now()))
            except sqlite3.IntegrityError:
                raise CatalogError(409, f"user {name!r} exists") from None
        return User(int(cur.lastrowid or 0), name)

    def user(self, name: str) -> User | None:
        row = self._db().execute("SELECT id, name FROM users WHERE name = ?", (name,)).fetchone()
        return User(row["id"], row["name"]) if row else None

    def new_token(self, user: str, label: str = "") -> str:
        """A new API token for ``user`` (created if new); it is shown once and only its hash kept."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._write() as db:
            row = db.execute("SELECT id FROM users WHERE name = ?", (user,)).fetchone()
            if row is None:
                raise CatalogError(404, f"no user {user!r} (add one with `palaestra hub user add`)")
            db.execute(
                "INSERT INTO tokens (user_id, sha256, label, created_at) VALUES (?, ?, ?, ?)",
                (row["id"], hash_token(token), label, _now()),
            )
        return token

    def revoke_tokens(self, user: str) -> int:
        with self._write() as db:
            cur = db.execute(
                "UPDATE tokens SET revoked_at = ? WHERE revoked_at IS NULL AND user_id = "
                "(SELECT id FROM users WHERE name = ?)",
                (_now(), user),
            )
        return cur.rowcount

    def authenticate(self, token: str | None) -> User:
        """The user a token belongs to; 401 with no token, 403 with a wrong or revoked one."""
        if not token:
            raise CatalogError(401, "this needs an API token (set PALAESTRA_HUB_TOKEN)")
        digest = hash_token(token)
        row = (
            self._db()
            .execute(
                "SELECT users.id, users.name, tokens.sha256 FROM tokens JOIN users ON users.id = tokens.user_id "
                "WHERE tokens.sha256 = ? AND tokens.revoked_at IS NULL",
                (digest,),
            )
            .fetchone()
        )
        if row is None or not hmac.compare_digest(row["sha256"], digest):
            raise CatalogError(403, "invalid or revoked API token")
        return User(row["id"], row["name"])

    # publishing

    @contextlib.contextmanager
    def adding_file(self, user: User, dist: DistInfo) -> Iterator[None]:
        """Record ``dist`` as uploaded by ``user``: the file must be put in place inside the block.

        The catalog rows are committed only if the block succeeds, so a file whose move fails is
        never listed; a crash between the move and the commit leaves a file no row names, which
        ``orphans`` finds at the next start.
        """
        with self._write() as db:
            project = db.execute("SELECT id, owner_id FROM projects WHERE name = ?", (dist.name,)).fetchone()
            if project is None:
                cur = db.execute(
                    "INSERT INTO projects (name, display_name, owner_id, created_at) VALUES (?, ?, ?, ?)",
                    (dist.name, dist.display_name, user.id, _now()),
                )
                project_id = int(cur.lastrowid or 0)
            elif project["owner_id"] != user.id:
                owner = db.execute("SELECT name FROM users WHERE id = ?", (project["owner_id"],)).fetchone()
                raise CatalogError(
                    403, f"{dist.name} belongs to {owner['name']}; this token is {user.name}'s"
                )
            else:
                project_id = project["id"]
            taken = db.execute("SELECT 1 FROM files WHERE filename = ?", (dist.filename,)).fetchone()
            if taken:
                raise CatalogError(
                    409, f"{dist.filename} exists: a published file never changes; bump the version"
                )
            release = db.execute(
                "SELECT id FROM releases WHERE project_id = ? AND version = ?", (project_id, dist.version)
            ).fetchone()
            if release is None:
                cur = db.execute(
                    "INSERT INTO releases (project_id, version, info, created_at) VALUES (?, ?, ?, ?)",
                    (project_id, dist.version, orjson.dumps(_release_info(dist)).decode(), _now()),
                )
                release_id = int(cur.lastrowid or 0)
            else:
                release_id = release["id"]
                if db.execute(
                    "SELECT 1 FROM files WHERE release_id = ? AND kind = ?", (release_id, dist.kind)
                ).fetchone():
                    raise CatalogError(
                        409,
                        f"{dist.name} {dist.version} already has a {dist.kind}: a published version "
                        "never changes; bump the version",
                    )
            db.execute(
                "INSERT INTO files (release_id, filename, kind, sha256, size, metadata_sha256, requires_python, "
                "eval_defaults, uploader_id, uploaded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    release_id,
                    dist.filename,
                    dist.kind,
                    dist.sha256,
                    dist.size,
                    hashlib.sha256(dist.metadata).hexdigest(),
                    dist.requires_python,
                    orjson.dumps(dist.eval_defaults).decode(),
                    user.id,
                    _now(),
                ),
            )
            yield

    def set_yanked(self, user: User, name: str, version: str, *, yanked: bool, reason: str = "") -> None:
        with self._write() as db:
            row = db.execute(
                "SELECT releases.id, projects.owner_id FROM releases JOIN projects ON projects.id = "
                "releases.project_id WHERE projects.name = ? AND releases.version = ?",
                (name, version),
            ).fetchone()
            if row is None:
                raise CatalogError(404, f"no release {name} {version}")
            if row["owner_id"] != user.id:
                raise CatalogError(403, f"{name} is not {user.name}'s")
            db.execute(
                "UPDATE releases SET yanked = ?, yanked_reason = ? WHERE id = ?",
                (int(yanked), reason if yanked else "", row["id"]),
            )

    # reading

    def projects(self) -> list[dict[str, Any]]:
        """Every project with its newest release's info (yanked releases only when all are)."""
        rows = (
            self._db()
            .execute(
                "SELECT projects.name, projects.display_name, users.name AS owner, releases.version, "
                "releases.info, releases.yanked, releases.created_at FROM projects "
                "JOIN users ON users.id = projects.owner_id JOIN releases ON releases.project_id = projects.id "
                "ORDER BY projects.name, releases.id"
            )
            .fetchall()
        )
        newest: dict[str, dict[str, Any]] = {}
        for row in rows:
            current = newest.get(row["name"])
            if current is None or not row["yanked"] or current["yanked"]:
                newest[row["name"]] = {
                    **orjson.loads(row["info"]),
                    **_pick(row, "name", "display_name", "owner", "version", "yanked"),
                    "updated_at": row["created_at"],
                }
        return sorted(newest.values(), key=lambda p: p["name"])

    def project(self, name: str) -> dict[str, Any] | None:
        """One project: its releases (newest last), each with its files."""
        db = self._db()
        head = db.execute(
            "SELECT projects.id, projects.name, projects.display_name, users.name AS owner, projects.created_at "
            "FROM projects JOIN users ON users.id = projects.owner_id WHERE projects.name = ?",
            (name,),
        ).fetchone()
        if head is None:
            return None
        releases = []
        for rel in db.execute("SELECT * FROM releases WHERE project_id = ? ORDER BY id", (head["id"],)):
            files = [
                {**dict(f), "eval_defaults": orjson.loads(f["eval_defaults"])}
                for f in db.execute(
                    "SELECT files.*, users.name AS uploader FROM files JOIN users ON users.id = files.uploader_id "
                    "WHERE release_id = ? ORDER BY files.id",
                    (rel["id"],),
                )
            ]
            releases.append(
                {
                    **orjson.loads(rel["info"]),
                    **_pick(rel, "version", "yanked", "yanked_reason", "created_at"),
                    "files": files,
                }
            )
        return {**dict(head), "releases": releases}

    def file(self, filename: str) -> dict[str, Any] | None:
        row = (
            self._db()
            .execute(
                "SELECT files.*, projects.name AS project FROM files JOIN releases ON releases.id = files.release_id "
                "JOIN projects ON projects.id = releases.project_id WHERE files.filename = ?",
                (filename,),
            )
            .fetchone()
        )
        return dict(row) if row else None

    def filenames(self) -> set[str]:
        return {row[0] for row in self._db().execute("SELECT filename FROM files")}

    # eval results

    def project_for_env(self, env_id: str) -> str | None:
        """The project whose newest release provides environment ``env_id``."""
        key = env_id.strip().lower().replace("-", "_")
        for project in self.projects():
            if key in {e.lower().replace("-", "_") for e in project["environments"]}:
                return str(project["name"])
        return None

    def add_result(self, user: User, project: str, run: dict[str, Any], *, has_report: bool) -> int:
        with self._write() as db:
            row = db.execute("SELECT id FROM projects WHERE name = ?", (project,)).fetchone()
            if row is None:
                raise CatalogError(404, f"no project {project}")
            try:
                cur = db.execute(
                    "INSERT INTO results (project_id, env_id, run_id, model, version, run, has_report, "
                    "uploader_id, uploaded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        row["id"],
                        run["env_id"],
                        run["run_id"],
                        run["model"],
                        run.get("env_version", ""),
                        orjson.dumps(run).decode(),
                        int(has_report),
                        user.id,
                        _now(),
                    ),
                )
            except sqlite3.IntegrityError:
                raise CatalogError(409, f"run {run['run_id']} is already attached to {project}") from None
        return int(cur.lastrowid or 0)

    def results(self, project: str) -> list[dict[str, Any]]:
        rows = (
            self._db()
            .execute(
                "SELECT results.id, results.has_report, results.uploaded_at, results.run, users.name AS uploader "
                "FROM results JOIN projects ON projects.id = results.project_id JOIN users ON users.id = "
                "results.uploader_id WHERE projects.name = ? ORDER BY results.id",
                (project,),
            )
            .fetchall()
        )
        return [  # only the record's public fields, whatever an older hub stored with them
            {
                **stored_record(orjson.loads(r["run"])),
                **_pick(r, "id", "has_report", "uploaded_at", "uploader"),
            }
            for r in rows
        ]

    def result_ids(self) -> set[int]:
        return {row[0] for row in self._db().execute("SELECT id FROM results WHERE has_report = 1")}


def _pick(row: sqlite3.Row, *keys: str) -> dict[str, Any]:
    return {k: row[k] for k in keys}


def _release_info(dist: DistInfo) -> dict[str, Any]:
    """What a release page shows, as the first file of the release describes it."""
    return {
        "summary": dist.summary,
        "description": dist.description,
        "description_content_type": dist.description_content_type,
        "keywords": list(dist.keywords),
        "requires_dist": list(dist.requires_dist),
        "requires_python": dist.requires_python,
        "environments": list(dist.environments),
        "project_urls": [list(p) for p in dist.project_urls],
        "license": dist.license,
    }

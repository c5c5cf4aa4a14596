"""The hub's catalog: users, API tokens, projects, releases, files and attached eval results.

One SQLite file (``database``: its schema, migrations and transactions). Only a token's sha256 is
stored: a token is 256 random bits, so a fast hash is enough and a stolen database reveals no token.

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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from palaestra.hub.database import CatalogError, Database
from palaestra.hub.dist import DistInfo
from palaestra.hub.results import stored_record

TOKEN_PREFIX = "pah_"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class User:
    id: int
    name: str


class Catalog(Database):
    """The SQLite catalog at ``path`` (created and migrated on open)."""

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
        ``HubData.recover`` removes at the next start.
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

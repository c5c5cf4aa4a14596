"""A hub's data folder (the catalog, the files, the clean-up after a crash), apart from the HTTP routes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from palaestra.hub.catalog import Catalog, User
from palaestra.hub.dist import DistInfo


class HubData:
    """A hub's data folder: the catalog and the files it lists.

    The folder holds ``hub.sqlite3`` (the catalog), ``files/``, ``reports/`` and ``tmp/``. An
    upload is streamed into ``tmp/``, checked whole, then moved into ``files/`` inside the catalog's
    write transaction; a refused one leaves nothing there (``forms``); at start, whatever a crash left
    half done (files in ``tmp/``, files no catalog row names) is removed, so the catalog and the files
    always agree.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = root / "files"
        self.reports = root / "reports"
        self.tmp = root / "tmp"
        for folder in (self.files, self.reports, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(root / "hub.sqlite3")

    def path(self, project: str, filename: str) -> Path:
        return self.files / project / filename

    def recover(self) -> list[Path]:
        """Remove what an interrupted upload left behind; returns the paths removed."""
        removed = [p for p in self.tmp.iterdir()]
        listed = self.catalog.filenames()
        for path in self.files.glob("*/*"):
            if path.name.removesuffix(".metadata") not in listed:
                removed.append(path)
        reports = self.catalog.result_ids()
        removed += [p for p in self.reports.iterdir() if p.stem not in {str(i) for i in reports}]
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        return removed

    def store(self, user: User, dist: DistInfo, upload: Path) -> None:
        """Move a checked upload into place and list it, or neither."""
        final = self.path(dist.name, dist.filename)
        metadata = final.with_name(final.name + ".metadata")
        moved = False
        try:
            with self.catalog.adding_file(user, dist):
                final.parent.mkdir(exist_ok=True)
                with metadata.open("wb") as f:
                    f.write(dist.metadata)
                    os.fsync(f.fileno())
                os.replace(upload, final)
                moved = True
                _fsync_dir(final.parent)  # the names are on disk before the catalog lists them
        except BaseException:
            if moved:
                final.unlink(missing_ok=True)
            if not final.exists():
                metadata.unlink(missing_ok=True)
            raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Package indexes for the install tests, made without a build backend or a hub.

``make_wheel`` writes a minimal valid wheel with any metadata (what a squatter uploads, or a
release with extras or a ``Requires-Python``); ``write_index`` lays wheels out as a static PEP 503
index; ``static_server`` serves a folder with ``python -m http.server``; ``answering_server``
answers every request with one fixed response (a hub that is not one).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import http.server
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename


def make_wheel(
    out: Path,
    name: str,
    version: str,
    files: dict[str, str],
    *,
    requires: tuple[str, ...] = (),
    headers: tuple[str, ...] = (),
    tag: str = "py3-none-any",
) -> Path:
    """A minimal valid wheel; ``headers`` are more core metadata lines (``Provides-Extra: x``)."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    members = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"{h}\n" for h in headers)
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = ""
    for path, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(text.encode())}\n"
    wheel = out / f"{stem}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in [*members.items(), (f"{info}/RECORD", record + f"{info}/RECORD,,\n")]:
            z.writestr(path, text)
    return wheel


def write_index(
    root: Path,
    wheels: list[Path],
    *,
    metadata: bool = False,
    yanked: frozenset[str] = frozenset(),
    requires_python: dict[str, str] | None = None,
) -> None:
    """A static PEP 503 index of ``wheels``: ``root/simple/NAME/index.html`` linking to ``root/files/``.

    With ``metadata``, each wheel's core metadata is beside it (PEP 658); ``yanked`` names the
    files marked yanked (PEP 592), ``requires_python`` maps file names to their ``Requires-Python``.
    """
    (root / "files").mkdir(parents=True)
    pages: dict[str, str] = {}
    for wheel in wheels:
        shutil.copy(wheel, root / "files" / wheel.name)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        attrs = f'href="../../files/{wheel.name}#sha256={sha}"'
        if metadata:
            with zipfile.ZipFile(wheel) as z:
                meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
            (root / "files" / f"{wheel.name}.metadata").write_bytes(meta)
            attrs += f' data-core-metadata="sha256={hashlib.sha256(meta).hexdigest()}"'
        if wheel.name in yanked:
            attrs += ' data-yanked=""'
        if spec := (requires_python or {}).get(wheel.name):
            attrs += f' data-requires-python="{html.escape(spec)}"'
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        pages[name] = pages.get(name, "") + f"<a {attrs}>{wheel.name}</a>\n"
    for name, links in pages.items():
        (root / "simple" / name).mkdir(parents=True)
        (root / "simple" / name / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"
        )


@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """``python -m http.server`` over ``folder`` on a free port; yields its URL."""
    command = [sys.executable, *"-u -m http.server --bind 127.0.0.1 --directory".split(), str(folder), "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        found = re.search(r"port (\d+)", server.stdout.readline())
        assert found, "http.server did not start"
        yield f"http://127.0.0.1:{found.group(1)}/"
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


@contextlib.contextmanager
def answering_server(status: int, content_type: str, body: bytes) -> Iterator[str]:
    """A server on a free port of 127.0.0.1 that answers every GET with this one response."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

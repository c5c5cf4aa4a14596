"""The bodies the hub's write routes take, read strictly: a malformed one is a 4xx that says why.

``form`` reads a multipart/form-data body (twine's upload form, a run's results): the fields the
route reads are kept (each once, UTF-8, under ``MAX_FIELD_BYTES``), file fields are streamed into
the data folder's ``tmp/``, and everything else is read and dropped. The temporary files live only
inside the ``async with`` block: whatever ends it (a refusal, a malformed or cut-off body, a client
gone mid-upload, a move into place) leaves ``tmp/`` as it was. ``json_object`` reads a small JSON
object and checks each field's type (``"false"`` is not a boolean).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from palaestra.hub.database import CatalogError

MAX_FIELD_BYTES = 1024 * 1024  # one text field (a run's metadata.json, twine's description)
MAX_PARTS = 1000  # twine sends a few dozen
MAX_JSON_BYTES = 64 * 1024
_CHUNK = 1 << 20


@dataclass
class Form:
    """A multipart form: the text fields asked for, and each file field as (file name, path in tmp/)."""

    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[str, Path]] = field(default_factory=dict)


def _shown(name: str) -> str:
    return repr(name[:100] + ("..." if len(name) > 100 else ""))


def check_length(request: web.Request, limit: int) -> None:
    """413 at once for a body that says it is over ``limit`` (one without a length is counted as it comes)."""
    if request.content_length is not None and request.content_length > limit:
        raise CatalogError(
            413, f"the request is {request.content_length} bytes; this hub takes at most {limit}"
        )


@contextlib.asynccontextmanager
async def form(
    request: web.Request, tmp: Path, *, text_fields: set[str], file_fields: set[str], max_bytes: int
) -> AsyncIterator[Form]:
    """The form in ``request``'s body; its files in ``tmp`` are removed when the block ends."""
    check_length(request, max_bytes)
    if request.content_type != "multipart/form-data":
        raise CatalogError(415, f"expected a multipart/form-data body, not {request.content_type!r}")
    created: list[Path] = []
    try:
        try:
            read = await _read(request, tmp, created, text_fields, file_fields, max_bytes)
        except (ValueError, AssertionError, KeyError, HttpProcessingError) as exc:
            # aiohttp's multipart reader: a bad boundary, a body cut short, a header too long
            raise CatalogError(400, f"malformed multipart/form-data body: {exc}") from None
        yield read
    finally:
        for path in created:
            path.unlink(missing_ok=True)


async def _read(
    request: web.Request,
    tmp: Path,
    created: list[Path],
    text_fields: set[str],
    file_fields: set[str],
    max_bytes: int,
) -> Form:
    out = Form()
    reader = await request.multipart()
    total = parts = 0
    while (part := await reader.next()) is not None:
        parts += 1
        if parts > MAX_PARTS:
            raise CatalogError(400, f"the form has over {MAX_PARTS} parts")
        if not isinstance(part, BodyPartReader):
            raise CatalogError(400, "unexpected nested multipart body")
        name = part.name
        if not name:
            raise CatalogError(400, "a form part without a name (Content-Disposition: form-data; name=...)")
        if name in out.fields or name in out.files:
            raise CatalogError(400, f"the form has two {_shown(name)} parts: send each field once")
        is_file, keep = name in file_fields, name in text_fields or name in file_fields
        limit = max_bytes if is_file else MAX_FIELD_BYTES
        buffer = bytearray()
        sink = None
        if is_file:
            path = tmp / uuid.uuid4().hex
            created.append(path)  # before it exists: removed whatever happens next
            out.files[name] = (part.filename or "", path)
            sink = path.open("wb")
        with sink if sink is not None else contextlib.nullcontext():
            size = 0
            while chunk := await part.read_chunk(_CHUNK):
                size += len(chunk)
                total += len(chunk)
                if total > max_bytes:
                    raise CatalogError(413, f"the request is over this hub's limit of {max_bytes} bytes")
                if size > limit and keep:
                    raise CatalogError(
                        413, f"form field {_shown(name)} is over this hub's limit of {limit} bytes"
                    )
                if sink is not None:
                    sink.write(chunk)
                elif keep:
                    buffer += chunk
            if sink is not None:
                sink.flush()
                await asyncio.to_thread(os.fsync, sink.fileno())
        if keep and not is_file:
            try:
                out.fields[name] = buffer.decode("utf-8")
            except UnicodeDecodeError:
                raise CatalogError(400, f"form field {_shown(name)} is not UTF-8 text") from None
    return out


async def json_object(request: web.Request, types: dict[str, type], required: set[str]) -> dict[str, Any]:
    """The body as a JSON object whose fields are all in ``types``, each of its type; 400 naming one that is not."""
    check_length(request, MAX_JSON_BYTES)
    if request.content_type != "application/json":
        raise CatalogError(415, f"expected an application/json body, not {request.content_type!r}")
    raw = bytearray()
    while chunk := await request.content.read(_CHUNK):
        raw += chunk
        if len(raw) > MAX_JSON_BYTES:
            raise CatalogError(413, f"the request is over this route's limit of {MAX_JSON_BYTES} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CatalogError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise CatalogError(400, "the body must be a JSON object")
    check_types(body, types, required)
    return body


def check_types(body: dict[str, Any], types: dict[str, type], required: set[str], where: str = "") -> None:
    """400 for a missing required field, an unknown one, or one of the wrong JSON type."""
    names = {bool: "true or false", str: "a string", int: "an integer", float: "a number", dict: "an object"}
    missing = sorted(required - body.keys())
    if missing:
        raise CatalogError(400, f"{where}field {missing[0]!r} is missing")
    for key, value in body.items():
        if key not in types:
            raise CatalogError(
                400, f"{where}unknown field {_shown(key)}: expected {', '.join(sorted(types))}"
            )
        want = types[key]
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            raise CatalogError(
                400, f"{where}field {key!r} must be {names.get(want, want.__name__)}, not {value!r:.100}"
            )

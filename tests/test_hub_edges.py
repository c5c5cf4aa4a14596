"""The hub's HTTP edges: malformed requests to every route get a 4xx and a message, never a 5xx, and
change nothing; every refused upload, however it ends, leaves ``tmp/`` empty.

Requests are written byte by byte on a socket, so that they may be as broken as a client can make them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from test_hub_dist import WHEEL_NAME, wheel_members, write_wheel

from palaestra.hub.data import HubData
from palaestra.testing.hub import running_hub

PROJECT, WHEEL = "palaestra-env-demo", WHEEL_NAME
Hub = tuple[str, HubData, str, str, int]  # url, data, alice's token, bob's token, the result id
MAX_UPLOAD = 200_000


def run_json(run_id: str = "run-1", **changes: Any) -> dict[str, Any]:
    """A complete run of the demo environment, as ``metadata.json`` holds it."""
    meta: dict[str, Any] = {
        "run_id": run_id,
        "env_id": "demo",
        "env_args": {},
        "model": "gpt-x",
        "num_examples": 4,
        "rollouts_per_example": 1,
        "seed": 0,
        "status": "complete",
        "counts": {"errors": 0},
        "summary": {"n_examples": 4, "reward": {"mean": 0.5, "ci95": [0.1, 0.9], "n": 4}},
    }
    meta.update(changes)
    return meta


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    """A hub with alice's demo wheel and one attached result; the wheel's bytes are in ``tmp_path``."""
    data = HubData(tmp_path / "data")
    data.catalog.add_user("alice")
    data.catalog.add_user("bob")
    alice, bob = data.catalog.new_token("alice"), data.catalog.new_token("bob")
    wheel = write_wheel(tmp_path / WHEEL, wheel_members()).read_bytes()
    async with running_hub(data.root, max_upload_bytes=MAX_UPLOAD) as url:
        status, body = await send(url, post("/legacy/", alice, form([file_part("content", WHEEL, wheel)])))
        assert status == 200, body
        run = form([text_part("run", orjson.dumps(run_json()))])
        status, body = await send(url, post("/api/results", alice, run))
        assert status == 200, body
        yield url, data, alice, bob, orjson.loads(body)["id"]


async def send(url: str, request: bytes, *, close_after: int | None = None) -> tuple[int, bytes]:
    """Write ``request`` (all of it, or its first ``close_after`` bytes, then end the stream); the answer."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request if close_after is None else request[:close_after])
        await writer.drain()
        if close_after is not None:
            writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.") else 0
    return status, body


def post(path: str, token: str, body: tuple[bytes, bytes], *, extra: bytes = b"") -> bytes:
    content_type, payload = body
    return (
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n"
        + b"Authorization: Bearer "
        + token.encode()
        + b"\r\n"
        + (b"Content-Type: " + content_type + b"\r\n" if content_type else b"")
        + b"Content-Length: "
        + str(len(payload)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + payload
    )


def get(target: bytes, *, headers: bytes = b"") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n" + headers + b"\r\n"


def text_part(name: str, value: bytes) -> tuple[bytes, bytes]:
    return b'Content-Disposition: form-data; name="' + name.encode() + b'"', value


def file_part(name: str, filename: str | bytes, data: bytes) -> tuple[bytes, bytes]:
    raw = filename if isinstance(filename, bytes) else filename.encode()
    head = b'Content-Disposition: form-data; name="' + name.encode() + b'"; filename="' + raw + b'"'
    return head + b"\r\nContent-Type: application/octet-stream", data


def form(
    parts: list[tuple[bytes, bytes]], *, end: bool = True, boundary: bytes = b"XyZ"
) -> tuple[bytes, bytes]:
    body = b"".join(b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + data + b"\r\n" for head, data in parts)
    return b"multipart/form-data; boundary=" + boundary, body + (b"--" + boundary + b"--\r\n" if end else b"")


def state(data: HubData) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Every file of the data folder and every catalog row: a refused request changes neither."""
    files = sorted(
        str(p.relative_to(data.root))
        for p in data.root.rglob("*")
        if p.is_file() and not p.name.startswith("hub.sqlite3")
    )
    db = sqlite3.connect(data.root / "hub.sqlite3")
    tables = ("users", "tokens", "projects", "releases", "files", "results")
    rows = [(t, *r) for t in tables for r in db.execute(f"SELECT * FROM {t} ORDER BY id")]
    db.close()
    return files, rows


def malformed_gets(result_id: int) -> list[bytes]:
    """GET requests with every kind of bad parameter, to every route that takes one."""
    params = [
        b"%ZZ",
        b"%",
        b"%F",
        b"%FF%FE",
        b"%00",
        b"a%00b",
        b"..%2F..%2Fhub.sqlite3",
        b"%2e%2e",
        b"..",
        b"%0D%0ALocation:%20x",
        b"A%0D%0AX",
        b"Palaestra_Env%00",
        b"x" * 4000,
        b"\xff\xfe",
        b"%C0%AF",
        b"%E2%80%AE",
    ]
    targets = []
    for p in params:
        targets += [
            b"/simple/" + p + b"/",
            b"/simple/" + p,
            b"/env/" + p + b"/",
            b"/env/" + p,
            b"/files/" + p + b"/" + p,
            b"/files/" + PROJECT.encode() + b"/" + p,
            b"/files/" + PROJECT.encode() + b"/" + p + b".metadata",
            b"/static/" + p,
            b"/?q=" + p + b"&tag=" + p,
            b"/simple/?format=" + p,
        ]
    targets += [
        b"/results/" + b"9" * 30 + b"/report.html",
        b"/results/-1/report.html",
        b"/results/" + str(result_id).encode() + b"%00/report.html",
    ]
    requests = [get(t) for t in targets]
    headers = [
        b"X-Big: " + b"a" * 20_000 + b"\r\n",
        b"".join(b"X-%d: y\r\n" % i for i in range(300)),
        b"Accept: ;;;q=x, */*;q=nan, text/html;q=-1\r\n",
        b"Accept: \xff\xfe\r\n",
        b"X-Field-" + b"n" * 10_000 + b": y\r\n",
        b"Host: <script>\r\n",
    ]
    for h in headers:
        requests += [get(b"/", headers=h), get(b"/env/" + PROJECT.encode() + b"/", headers=h)]
    requests += [
        b"GET /\x00 HTTP/1.1\r\nHost: hub\r\n\r\n",
        b"GET " + b"/a" * 6000 + b" HTTP/1.1\r\n\r\n",
        b"BREW / HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n",
    ]
    return requests


NESTED = b'Content-Type: multipart/mixed; boundary=inner\r\nContent-Disposition: form-data; name="content"'


def malformed_posts(alice: str, wheel: bytes) -> list[tuple[bytes, int | None]]:
    """Broken bodies for every write route: (request, how many of its bytes to send before ending)."""
    content = [file_part("content", WHEEL, wheel)]
    bad_forms = [
        (b"", b""),
        (b"text/plain", b"hello"),
        (b"multipart/form-data", b"--x\r\n\r\n"),  # no boundary
        (b"multipart/form-data; boundary=XyZ", b""),
        (b"multipart/form-data; boundary=XyZ", b"garbage"),
        (b"multipart/form-data; boundary=" + b"b" * 100, b""),
        (b"multipart/mixed; boundary=XyZ", form(content)[1]),
        form(content, end=False),  # truncated: no closing boundary
        form([(b"Content-Disposition: form-data", b"x")]),  # no name
        form([(b'Content-Disposition: form-data; name="' + b"n" * 10_000 + b'"', b"x")]),
        form([(b'Content-Disposition: form-data; name="x"\r\nX-' + b"h" * 10_000 + b": y", b"x")]),
        form([(b'Content-Disposition: form-data; name="x"\r\n' + b"X-a: y\r\n" * 200, b"x")]),
        form([(NESTED, b"--inner\r\n\r\nx\r\n--inner--")]),
        form([file_part("content", WHEEL.replace(".whl", "\x00.whl"), wheel)]),
        form([file_part("content", b"\xff\xfe.whl", wheel)]),
        form([file_part("content", "<script>alert(1)</script>.whl", wheel)]),
        form([file_part("content", "../../" + WHEEL, wheel)]),
        form([file_part("content", "palaestra_env_demo-0.3.0-py3-none-" + "a" * 300 + ".whl", wheel)]),
        form([*content, *content]),
        form([text_part("sha256_digest", b"\xff\xfe"), *content]),
        form([text_part(":action", b"remove_all"), *content]),
        form([text_part("name", b"palaestra-env-other"), *content]),
        form([text_part("run", b"\xff")]),
        form([text_part("run", b"{not json")]),
        form([text_part("run", b"[]")]),
        form([text_part("run", orjson.dumps(run_json("r2", model=5)))]),
        form(
            [
                text_part(
                    "run", orjson.dumps(run_json("r3", summary={"n_examples": "x", "reward": {"mean": 1}}))
                )
            ]
        ),
        form([text_part("run", orjson.dumps(run_json("r4", counts={"errors": [1]})))]),
        form([text_part("run", orjson.dumps(run_json("r5", model="m" * 1000)))]),
        form([text_part("run", orjson.dumps(run_json("r6", env_id="\x00")))]),
    ]
    requests: list[tuple[bytes, int | None]] = []
    for path in ("/legacy/", "/api/results", "/api/yank"):
        requests += [(post(path, alice, body), None) for body in bad_forms]
        whole = post(path, alice, form(content))
        requests += [(whole, len(whole) - 100), (whole, len(whole) // 2)]  # the body cut short
        chunked = (
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: hub\r\nConnection: close\r\nAuthorization: "
            b"Bearer " + alice.encode() + b"\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n"
        )
        requests.append((chunked, None))
    json = b"application/json"
    for body in [
        b"",
        b"nope",
        b"[]",
        b'"x"',
        b"\xff",
        b'{"name": "demo"}',
        b'{"name": 1, "version": "0.2.0"}',
        b'{"name": "demo", "version": "0.2.0", "yanked": "false"}',
        b'{"name": "demo", "version": "0.2.0", "yanked": 0}',
        b'{"name": "demo", "version": "0.2.0", "reason": 5}',
        b'{"name": "demo", "version": "0.2.0", "extra": true}',
        b'{"name": "demo", "version": "0.2.0", "reason": "' + b"r" * 2000 + b'"}',
        b'{"name": "demo", "version": "' + b"9" * 70_000 + b'"}',
        b'{"name": "demo", "version": "' + b"9" * 5_000 + b'"}',
    ]:
        requests.append((post("/api/yank", alice, (json, body)), None))
    requests.append(
        (post("/api/yank", alice, (b"text/plain", b'{"name": "demo", "version": "0.2.0"}')), None)
    )
    return requests


async def test_malformed_requests_get_a_4xx_with_a_message_and_change_nothing(
    hub: Hub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, data, alice, _bob, result_id = hub
    before = state(data)
    wheel = (tmp_path / WHEEL).read_bytes()
    caplog.set_level(logging.ERROR, logger="palaestra.hub")
    for request in malformed_gets(result_id):
        status, body = await send(url, request)
        assert 400 <= status < 500 or status in (200, 301), (status, request[:120], body[:200])
    for request, cut in malformed_posts(alice, wheel):
        status, body = await send(url, request, close_after=cut)
        if cut is not None and status == 0:
            continue  # the body was cut short: the hub may close without an answer
        assert 400 <= status < 500 and body.strip(), (status, request[:300], body[:300])
    assert [r for r in caplog.records if r.name == "palaestra.hub"] == []  # every refusal was on purpose
    assert state(data) == before
    assert not any(data.tmp.iterdir())
    # and the hub still serves
    status, body = await send(url, get(b"/env/" + PROJECT.encode() + b"/"))
    assert status == 200 and b"gpt-x" in body


def yanked(data: HubData) -> bool:
    project = data.catalog.project(PROJECT)
    assert project is not None
    return bool(project["releases"][0]["yanked"])


async def test_json_fields_are_strictly_typed(hub: Hub) -> None:
    url, data, alice, _bob, _ = hub
    cases = {
        b'{"name": "demo", "version": "0.2.0", "yanked": "false"}': "field 'yanked' must be true or false, not 'false'",
        b'{"name": 7, "version": "0.2.0"}': "field 'name' must be a string, not 7",
        b'{"name": "demo", "version": 0.2}': "field 'version' must be a string, not 0.2",
        b'{"name": "demo"}': "field 'version' is missing",
        b'{"name": "demo", "version": "0.2.0", "yank": false}': "unknown field 'yank'",
    }
    for body, message in cases.items():
        status, answer = await send(url, post("/api/yank", alice, (b"application/json", body)))
        assert status == 400 and message in answer.decode(), (body, answer)
    assert not yanked(data)
    run = form([text_part("run", orjson.dumps(run_json("r9", counts={"errors": "3"})))])
    status, answer = await send(url, post("/api/results", alice, run))
    assert status == 400 and "counts.errors must be a non-negative integer, not '3'" in answer.decode()
    status, answer = await send(
        url,
        post(
            "/api/yank", alice, (b"application/json", b'{"name": "palaestra-env-demo", "version": "0.2.0"}')
        ),
    )
    assert status == 200 and yanked(data)


async def tmp_empty(data: HubData, timeout: float = 10.0) -> bool:
    """Whether ``tmp/`` is (or, within ``timeout``, becomes) empty: a handler may still be unwinding."""
    deadline = asyncio.get_running_loop().time() + timeout
    while any(data.tmp.iterdir()):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_every_refused_upload_leaves_tmp_empty(hub: Hub, tmp_path: Path) -> None:
    url, data, alice, bob, _ = hub
    new = "palaestra_env_demo-0.3.0-py3-none-any.whl"
    wheel = write_wheel(tmp_path / new, wheel_members(version="0.3.0")).read_bytes()
    old = (tmp_path / WHEEL).read_bytes()
    content = file_part("content", new, wheel)
    run, report = (
        text_part("run", orjson.dumps(run_json("run-2"))),
        file_part("report", "r.html", b"<p>hi</p>"),
    )
    chunked_head = (
        b"POST /legacy/ HTTP/1.1\r\nHost: hub\r\nConnection: close\r\nAuthorization: Bearer "
        + alice.encode()
        + b"\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    big = form([file_part("content", new, bytes(MAX_UPLOAD + 1))])[1]
    chunked = (
        chunked_head
        + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (big[:65536], big[65536:]))
        + b"0\r\n\r\n"
    )
    cases: dict[str, tuple[bytes, int | None, int]] = {  # what is sent, how much of it, the status
        "two content parts": (post("/legacy/", alice, form([content, content])), None, 400),
        "over the limit, without a length": (chunked, None, 413),
        "over the limit, by its length": (
            post("/legacy/", alice, form([file_part("content", new, bytes(MAX_UPLOAD))])),
            None,
            413,
        ),
        "a corrupt wheel": (
            post("/legacy/", alice, form([file_part("content", new, wheel[:-30])])),
            None,
            400,
        ),
        "a bad file name": (
            post("/legacy/", alice, form([file_part("content", "x\x00.whl", wheel)])),
            None,
            400,
        ),
        "a digest that does not match": (
            post("/legacy/", alice, form([text_part("sha256_digest", b"0" * 64), content])),
            None,
            400,
        ),
        "another name in the form": (
            post("/legacy/", alice, form([text_part("name", b"palaestra-env-x"), content])),
            None,
            400,
        ),
        "a file that exists": (post("/legacy/", alice, form([file_part("content", WHEEL, old)])), None, 409),
        "another user's project": (post("/legacy/", bob, form([content])), None, 403),
        "an unsupported action": (
            post("/legacy/", alice, form([content, text_part(":action", b"x")])),
            None,
            400,
        ),
        "a field after the file that is not UTF-8": (
            post("/legacy/", alice, form([content, text_part("name", b"\xff")])),
            None,
            400,
        ),
        "a body cut after the file": (post("/legacy/", alice, form([content], end=False)), None, 400),
        "a report with a bad run": (
            post("/api/results", alice, form([report, text_part("run", b"{}")])),
            None,
            400,
        ),
        "a report for no environment": (
            post(
                "/api/results",
                alice,
                form([report, text_part("run", orjson.dumps(run_json("r", env_id="maze")))]),
            ),
            None,
            404,
        ),
        "a report of an attached run": (
            post("/api/results", alice, form([report, text_part("run", orjson.dumps(run_json()))])),
            None,
            409,
        ),
        "two reports": (post("/api/results", alice, form([report, report, run])), None, 400),
    }
    before = state(data)
    for what, (request, cut, expected) in cases.items():
        status, body = await send(url, request, close_after=cut)
        assert status == expected, (what, status, body)
        assert await tmp_empty(data, timeout=0), what  # gone before the answer was sent
        assert state(data) == before, what

    # a client that goes away in the middle of its body, and one that stops sending and closes
    request = post("/legacy/", alice, form([file_part("content", new, wheel + bytes(100_000))]))
    for close in ("reset", "eof"):
        reader, writer = await asyncio.open_connection(urlsplit(url).hostname, urlsplit(url).port)
        writer.write(request[: len(request) - 50_000])
        await writer.drain()
        deadline = asyncio.get_running_loop().time() + 10
        while not any(data.tmp.iterdir()):  # the upload is being written
            assert asyncio.get_running_loop().time() < deadline, "the upload never reached tmp/"
            await asyncio.sleep(0.01)
        if close == "eof":  # the client says it is done, early
            writer.write_eof()
            await reader.read()
        else:  # the connection drops: a reset, not a goodbye
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        assert await tmp_empty(data), close
    assert state(data) == before
    # and a good upload still lands
    status, body = await send(url, post("/legacy/", alice, form([content])))
    assert status == 200 and not any(data.tmp.iterdir()), body

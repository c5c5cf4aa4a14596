"""Hub throughput: the index requests of installs and concurrent uploads, each against a reference.

The hub runs as ``palaestra hub serve`` in a child process over a data folder with a few published
environment packages. Workloads:

- ``install``: what pip does for one package, 3 requests: the project's index page
  (``/simple/NAME/``), the wheel's core metadata (``FILE.metadata``, PEP 658) and the wheel, whose
  sha256 the client checks; many installs at a fixed concurrency over one aiohttp session.
  Against the hub, the page is PEP 691 JSON (as pip asks for it) and, for the like-for-like row,
  PEP 503 HTML.
  **Reference**: the same request set against a static export of the same hub
  (``palaestra.hub.export.export``) served by Python's ``http.server`` (``ThreadingHTTPServer`` and
  ``SimpleHTTPRequestHandler``, as ``python -m http.server`` runs them) in a child process, with
  three settings changed so that it measures serving, not TCP artefacts: HTTP/1.1 keep-alive (as
  with the hub), ``TCP_NODELAY`` (it writes headers and body separately: without it each response
  waits ~40 ms for a delayed ACK) and a listen backlog of 128 (socketserver's 5 drops a burst of
  50 connections, whose SYNs are retried after 1 s); and no access log, as the hub keeps none.
  A static export has HTML index pages only, so its page requests get HTML.
- ``upload``: N concurrent uploads of distinct versions of one package (``palaestra.hub.client.upload``,
  the form twine sends), to a fresh hub each round. **Reference**: the same uploads to a bare
  aiohttp sink in a child process that streams the file to disk and fsyncs it, checking nothing
  (the least any upload server does).

Every figure is the median of ``--rounds`` rounds (3), the workloads interleaved round by round.
The client and the servers share this machine's cores: read the ratios, measured side by side.

Usage: python benchmarks/hub.py [--quick] [--installs 4000] [--uploads 40] [--upload-kb 1024]
       [--concurrency 50] [--packages 5] [--rounds 3] [--breakdown]

``--breakdown`` adds each of the 3 requests of an install alone, against the hub and the static export.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import aiohttp
import orjson

from palaestra.hub.client import upload
from palaestra.hub.data import HubData
from palaestra.hub.export import export
from palaestra.hub.index import HTML_TYPE, JSON_TYPE
from palaestra.runner import run_async
from palaestra.testing.hub import build_dists, hub_process, write_env_package

TIMEOUT = aiohttp.ClientTimeout(total=300, connect=30)
PIP_ACCEPT = f"{JSON_TYPE}, {HTML_TYPE}; q=0.1, text/html; q=0.01"  # what pip sends: JSON preferred

# the index reference: http.server's ThreadingHTTPServer, as `python -m http.server` runs it but
# for three settings that otherwise measure TCP artefacts rather than serving
STATIC = """
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

class Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as with the hub (the default, HTTP/1.0, connects per request)
    disable_nagle_algorithm = True  # headers and body are two writes: each response waited for a delayed ACK
    def log_message(self, format, *args):  # the hub logs no access either
        pass

class Server(ThreadingHTTPServer):
    request_queue_size = 128  # socketserver's 5 drops a burst of connections (SYN retried after 1 s)

server = Server(("127.0.0.1", 0), partial(Handler, directory=sys.argv[1]))
print(f"static at http://127.0.0.1:{server.server_address[1]}/", flush=True)
server.serve_forever()
"""

# the upload reference: stream the multipart file field to disk and fsync it, nothing else
SINK = """
import asyncio, os, sys, uuid
from aiohttp import web
from palaestra.serve import start

async def post(request):
    reader = await request.multipart()
    name = ""
    while (part := await reader.next()) is not None:
        if part.filename:
            name = part.filename
            with open(os.path.join(sys.argv[1], uuid.uuid4().hex), "wb") as out:
                while chunk := await part.read_chunk(1 << 20):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        else:
            await part.read()
    return web.json_response({"filename": name})

async def main():
    app = web.Application(client_max_size=1 << 30)
    app.add_routes([web.post("/legacy/", post)])
    runner, url = await start(app, "127.0.0.1", 0)
    print("sink at " + url.removesuffix("v1"), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@dataclass(frozen=True)
class Install:
    """One package's requests, as paths under a server's base URL."""

    name: str
    page: str
    metadata: str
    wheel: str
    wheel_sha256: str


@dataclass(frozen=True)
class Row:
    workload: str
    server: str
    count: int  # requests (install) or uploads
    seconds: list[float]
    megabytes: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rounds(self) -> str:
        return ", ".join(f"{s:.2f}" for s in self.seconds)

    @property
    def rate(self) -> float:
        return self.count / self.median


@contextlib.contextmanager
def child_server(code: str, *args: str) -> Iterator[str]:
    """Run ``code`` (which prints a line ending in its URL) in a child process; yields the URL."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        found = re.search(r"at (http://\S+/)", proc.stdout.readline())
        if found is None:
            raise RuntimeError("a reference server did not start")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def stop_hub(proc: subprocess.Popen[str]) -> None:
    """End a hub started by ``hub_process`` and show anything it logged (an error under load)."""
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    if out.strip():
        print(f"!! the hub wrote:\n{out.strip()}", file=sys.stderr)


def new_hub(data: Path) -> str:
    """A data folder with user ``bench``; returns its API token."""
    hub_data = HubData(data)
    hub_data.catalog.add_user("bench")
    return hub_data.catalog.new_token("bench")


def build_packages(root: Path, count: int) -> dict[str, list[Path]]:
    """``count`` small environment packages: wheel and sdist of each."""
    out = {}
    for i in range(count):
        name = f"palaestra-env-bench{i}"
        package = write_env_package(root / "src", name=name, module=f"bench{i}_env", env_name=f"bench{i}")
        out[name] = build_dists(package, root / "dist" / name)
    return out


def build_upload_wheels(root: Path, count: int, kilobytes: int) -> list[Path]:
    """Wheels of ``count`` versions of one package, each carrying ``kilobytes`` of random data."""
    wheels = []
    for i in range(count):
        package = write_env_package(
            root / "src",
            name="palaestra-env-upload",
            module="upload_env",
            env_name="upload",
            version=f"1.0.{i}",
        )
        (package / "upload_env" / "payload.bin").write_bytes(os.urandom(kilobytes * 1024))
        (wheel,) = [p for p in build_dists(package, root / "dist" / str(i)) if p.suffix == ".whl"]
        wheels.append(wheel)
    return wheels


async def plan(url: str, names: list[str]) -> list[Install]:
    """Each package's requests, read from the hub's JSON index (paths relative to the base URL)."""
    installs = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for name in names:
            page = f"simple/{name}/"
            async with session.get(urljoin(url, page), headers={"Accept": JSON_TYPE}) as r:
                r.raise_for_status()
                data = orjson.loads(await r.read())
            (wheel,) = [f for f in data["files"] if f["filename"].endswith(".whl")]
            path = urljoin(page, wheel["url"])  # relative links: the same path on the static export
            installs.append(Install(name, page, path + ".metadata", path, wheel["hashes"]["sha256"]))
    return installs


PARTS = ("page", "metadata", "wheel")


async def run_installs(
    base: str,
    accept: str,
    installs: list[Install],
    count: int,
    concurrency: int,
    parts: tuple[str, ...] = PARTS,
) -> float:
    """``count`` installs (cycling over ``installs``; only the requests in ``parts``), ``concurrency``
    at a time; returns the seconds."""
    jobs = itertools.islice(itertools.cycle(installs), count)

    async def get(session: aiohttp.ClientSession, job: Install, part: str) -> None:
        url = base + getattr(job, part)
        async with session.get(url, headers={"Accept": accept} if part == "page" else {}) as r:
            body = await r.read()
        if part == "page":
            ok = job.wheel.rsplit("/", 1)[1].encode() in body
        elif part == "metadata":
            ok = body.startswith(b"Metadata-Version")
        else:
            ok = hashlib.sha256(body).hexdigest() == job.wheel_sha256
        if r.status != 200 or not ok:
            raise RuntimeError(f"{url}: {r.status}, or not the content expected")

    async def client(session: aiohttp.ClientSession) -> None:
        for job in jobs:  # shared: each client takes the next install
            for part in parts:
                await get(session, job, part)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        return time.perf_counter() - start


async def run_uploads(url: str, token: str, wheels: list[Path]) -> float:
    start = time.perf_counter()
    done = await asyncio.gather(*(upload(url, token, [w]) for w in wheels))
    seconds = time.perf_counter() - start
    if sorted(d[0]["filename"] for d in done) != sorted(w.name for w in wheels):
        raise RuntimeError(f"uploads answered {done}")
    return seconds


def measure_index(root: Path, args: argparse.Namespace) -> list[Row]:
    data = root / "index-data"
    token = new_hub(data)
    packages = build_packages(root / "index-packages", args.packages)
    with hub_process(data) as (hub, proc):
        for paths in packages.values():
            run_async(upload(hub, token, paths))
        export(HubData(data), root / "export")
        installs = run_async(plan(hub, sorted(packages)))
        with child_server(STATIC, str(root / "export")) as static:
            servers = {"hub": hub, "static export, http.server": static}
            # (workload, server, Accept of the page, the requests of an install made)
            cases: list[tuple[str, str, str, tuple[str, ...]]] = [
                ("install (JSON page)", "hub", PIP_ACCEPT, PARTS),
                ("install (HTML page)", "hub", HTML_TYPE, PARTS),
                ("install (HTML page)", "static export, http.server", HTML_TYPE, PARTS),
            ]
            if args.breakdown:
                cases += [
                    (f"{part} only", server, HTML_TYPE, (part,)) for part in PARTS for server in servers
                ]
            for _, server, accept, parts in cases:  # warm-up: connections, caches, the page cache
                run_async(
                    run_installs(servers[server], accept, installs, args.concurrency, args.concurrency, parts)
                )
            seconds: list[list[float]] = [[] for _ in cases]
            for _ in range(args.rounds):
                for i, (_, server, accept, parts) in enumerate(cases):
                    seconds[i].append(
                        run_async(
                            run_installs(
                                servers[server], accept, installs, args.installs, args.concurrency, parts
                            )
                        )
                    )
        stop_hub(proc)
    rows = [
        Row(f"{workload}, concurrency {args.concurrency}", server, len(parts) * args.installs, s)
        for (workload, server, _, parts), s in zip(cases, seconds, strict=True)
    ]
    return rows


def measure_uploads(root: Path, args: argparse.Namespace) -> list[Row]:
    wheels = build_upload_wheels(root / "upload-packages", args.uploads, args.upload_kb)
    megabytes = sum(w.stat().st_size for w in wheels) / 1e6
    hub_seconds, sink_seconds = [], []
    for round_ in range(args.rounds):
        data = root / f"upload-data-{round_}"
        token = new_hub(data)
        with hub_process(data) as (hub, proc):
            hub_seconds.append(run_async(run_uploads(hub, token, wheels)))
            stop_hub(proc)
        stored = list((data / "files" / "palaestra-env-upload").glob("*.whl"))
        if len(stored) != len(wheels):
            raise RuntimeError(f"the hub stored {len(stored)} of {len(wheels)} uploads")
        (root / f"sink-{round_}").mkdir()
        with child_server(SINK, str(root / f"sink-{round_}")) as sink:
            sink_seconds.append(run_async(run_uploads(sink, "unused", wheels)))
    workload = f"upload ({len(wheels)} concurrent, {megabytes / len(wheels):.2f} MB each)"
    return [
        Row(workload, "hub", len(wheels), hub_seconds, megabytes),
        Row(workload, "aiohttp sink (stream + fsync)", len(wheels), sink_seconds, megabytes),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--installs", type=int, default=4000, help="installs per measurement (3 requests each)"
    )
    parser.add_argument("--uploads", type=int, default=40, help="concurrent uploads per measurement")
    parser.add_argument("--upload-kb", type=int, default=1024, help="random payload in each uploaded wheel")
    parser.add_argument("--concurrency", type=int, default=50, help="installs in flight at once")
    parser.add_argument(
        "--packages", type=int, default=5, help="packages on the hub (installs cycle over them)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="each figure is the median of this many")
    parser.add_argument(
        "--breakdown", action="store_true", help="also each request kind alone, hub and static"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small counts, one round")
    args = parser.parse_args()
    if args.quick:
        args.installs, args.uploads, args.upload_kb, args.packages, args.rounds = 100, 5, 64, 2, 1
    load = os.getloadavg()[0]
    print(
        f"{os.cpu_count()} cores, shared by the client (this process) and the servers (child processes); "
        f"{args.rounds} round(s), medians. 1-minute load before: {load:.2f}"
    )
    print(
        "Index reference: the hub's static export under http.server's ThreadingHTTPServer (HTTP/1.1, "
        "TCP_NODELAY, backlog 128); it has HTML index pages only, so its page requests get HTML."
    )
    print(
        "Upload reference: an aiohttp sink that streams each file to disk and fsyncs it, checking nothing.\n"
    )
    with tempfile.TemporaryDirectory(prefix="palaestra-bench-hub-") as tmp:
        index_rows = measure_index(Path(tmp), args)
        upload_rows = measure_uploads(Path(tmp), args)
    print("| workload | server | requests | seconds | each round | requests/s | MB/s | hub ÷ reference |")
    print("|---|---|---|---|---|---|---|---|")
    static = {row.workload: row.rate for row in index_rows if row.server != "hub"}
    for row in index_rows:
        print(
            f"| {row.workload} | {row.server} | {row.count} | {row.median:.2f} | {row.rounds} | {row.rate:,.0f} |  | "
            f"{row.rate / static[row.workload.replace('JSON', 'HTML')]:.2f}× |"
        )
    reference = upload_rows[-1].rate
    for row in upload_rows:
        print(
            f"| {row.workload} | {row.server} | {row.count} | {row.median:.2f} | {row.rounds} | {row.rate:,.1f} uploads/s | "
            f"{row.megabytes / row.median:,.1f} | {row.rate / reference:.2f}× |"
        )
    print(f"\n1-minute load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Reading an uploaded wheel (zip) or sdist (tar.gz) through, within bounds, before anything is kept.

An upload is read whole once, to check every member's CRC (or the gzip stream's), so the work an
upload can cost the hub is bounded here, not by the upload's size: ``Limits`` caps the bytes of
one member and of the whole archive once decompressed, the number of members, and the parts of an
archive that the standard library parses eagerly (a zip's central directory; a tar's headers).
Each bound is checked from the archive's own declarations first, where it has them, and on the
bytes actually decompressed. Nothing is extracted; only the members a caller asks for are kept.
"""

from __future__ import annotations

import gzip
import io
import re
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MiB = 1024 * 1024
_CHUNK = MiB
# a tar header extension (pax record, GNU long name) is read and parsed whole: longer is refused
MAX_TAR_EXTENSION = 64 * 1024
# Python's tarfile searches each pax header with a backtracking pattern (CVE-2024-6232): long digit
# runs and repeated hdrcharset keys make that quadratic, and no real sdist has either
_SLOW_PAX = re.compile(rb"[0-9]{33}")


class DistError(ValueError):
    """An uploaded file is not a valid environment distribution; the message says why, for the uploader."""


@dataclass(frozen=True)
class Limits:
    """What one uploaded archive may hold (bytes are counted decompressed)."""

    member_bytes: int = 50 * MiB  # one member
    total_bytes: int = 256 * MiB  # all members together (an sdist: the whole tar stream)
    members: int = 10_000  # files, folders and links
    directory_bytes: int = 4 * MiB  # a wheel's central directory (the list of its members)
    header_bytes: int = 8 * MiB  # an sdist's tar headers and header extensions, together
    metadata_bytes: int = 1 * MiB  # each file the hub parses and keeps (METADATA or PKG-INFO: the README)


def _mib(n: int) -> str:
    """A size as people read it: exact MiB or KiB when it is a round number of them."""
    for unit, name in ((MiB, "MiB"), (1024, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def _zip_directory(f: IO[bytes], limits: Limits) -> None:
    """Refuse a zip whose end record declares more members or a bigger central directory than allowed.

    ``ZipFile`` reads and parses the whole central directory when it opens a file: its size is
    checked first, from the end record (and the zip64 one when that is used).
    """
    f.seek(0, io.SEEK_END)
    size = f.tell()
    tail_size = min(size, 22 + 65535)  # the end record and the longest comment
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        raise DistError("not a valid wheel: not a zip file (no end of central directory)")
    entries, directory = struct.unpack("<10xHL6x", tail[at : at + 22])
    if (entries == 0xFFFF or directory == 0xFFFFFFFF) and at >= 20:
        locator = tail[at - 20 : at]
        if locator[:4] == b"PK\x06\x07":
            (offset,) = struct.unpack("<8xQ4x", locator)
            f.seek(offset)
            record = f.read(56)
            if len(record) == 56 and record[:4] == b"PK\x06\x06":
                entries, directory = struct.unpack("<32xQQ8x", record)
    if entries > limits.members:
        raise DistError(f"the wheel has {entries} members; the hub takes at most {limits.members}")
    if directory > limits.directory_bytes:
        raise DistError(
            f"the wheel's list of members is {_mib(directory)}; the hub takes at most {_mib(limits.directory_bytes)}"
        )


def read_wheel(
    path: Path, limits: Limits, choose: Callable[[list[str]], Iterable[str]]
) -> tuple[list[str], dict[str, bytes]]:
    """Every member name of the wheel at ``path``, and the content of those ``choose(names)`` names.

    Every member is decompressed once and its CRC checked; DistError for anything outside ``limits``,
    a compression other than stored or deflate, or bytes before the first member (a zip appended to
    something else, which could make the file mean another thing to another reader).
    """
    try:
        with path.open("rb") as f:
            _zip_directory(f, limits)
            f.seek(0)
            start = f.read(4)
            with zipfile.ZipFile(f) as zf:
                infos = zf.infolist()
                if len(infos) > limits.members:
                    raise DistError(
                        f"the wheel has {len(infos)} members; the hub takes at most {limits.members}"
                    )
                if infos and (start != b"PK\x03\x04" or min(i.header_offset for i in infos) != 0):
                    raise DistError("not a valid wheel: it has data before its first member")
                total = 0
                for info in infos:
                    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                        raise DistError(
                            f"member {info.filename} is compressed with method {info.compress_type}: "
                            "the hub takes stored or deflate members"
                        )
                    if info.file_size > limits.member_bytes:
                        raise DistError(
                            f"member {info.filename} is {_mib(info.file_size)} decompressed; the hub takes at "
                            f"most {_mib(limits.member_bytes)} per member"
                        )
                    total += info.file_size
                if total > limits.total_bytes:
                    raise DistError(
                        f"the wheel is {_mib(total)} decompressed; the hub takes at most {_mib(limits.total_bytes)}"
                    )
                names = [info.filename for info in infos]
                if len(set(names)) != len(names):
                    raise DistError("not a valid wheel: some member names occur twice")
                wanted = set(choose(names))
                kept: dict[str, bytes] = {}
                for info in infos:  # what ZipFile.testzip does, keeping the reason a member is bad
                    # ZipFile yields no more than a member's declared size, checked above
                    chunks: list[bytes] = []
                    try:
                        with zf.open(info) as member:
                            while chunk := member.read(_CHUNK):
                                if info.filename in wanted:
                                    chunks.append(chunk)
                    except zipfile.BadZipFile as exc:
                        raise DistError(f"not a valid wheel: corrupt member {info.filename} ({exc})") from exc
                    if info.filename in wanted:
                        kept[info.filename] = b"".join(chunks)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, struct.error) as exc:
        raise DistError(f"not a valid wheel: {exc}") from exc
    return names, kept


class _TarStream(io.RawIOBase):
    """The decompressed stream of a .tar.gz as ``tarfile`` reads it: forward only, every byte counted.

    ``tarfile`` itself reads only headers through ``read``; members' contents are read with ``data``.
    """

    def __init__(self, gz: gzip.GzipFile, limits: Limits) -> None:
        super().__init__()
        self._gz, self._limits = gz, limits
        self._pos = 0
        self._header_bytes = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._pos + offset
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or target < self._pos:
            raise DistError("not a valid sdist: its tar headers point backwards")
        self.skip(target - self._pos)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > MAX_TAR_EXTENSION:
            raise DistError(f"the sdist has a tar header over {_mib(MAX_TAR_EXTENSION)}")
        self._header_bytes += size
        if self._header_bytes > self._limits.header_bytes:
            raise DistError(
                f"the sdist's tar headers are over {_mib(self._limits.header_bytes)}: too many or too long"
            )
        data = self.data(size)
        if _SLOW_PAX.search(data) or data.count(b"hdrcharset") > 1:
            raise DistError(
                "the sdist has a malformed tar header (a run of over 32 digits, or hdrcharset twice)"
            )
        return data

    def data(self, size: int) -> bytes:
        """Up to ``size`` bytes of the stream, counted against the whole archive's limit."""
        data = self._gz.read(size)
        self._pos += len(data)
        if self._pos > self._limits.total_bytes:
            raise DistError(f"the sdist is over {_mib(self._limits.total_bytes)} decompressed")
        return data

    def skip(self, size: int) -> None:
        while size > 0 and (chunk := self.data(min(size, _CHUNK))):
            size -= len(chunk)


def read_sdist(path: Path, limits: Limits, check: Callable[[tarfile.TarInfo], bool]) -> dict[str, bytes]:
    """The content of the sdist's files ``check(member)`` keeps, by member name, after reading it through.

    ``check`` sees every member in order (and raises DistError for one it refuses); the gzip stream is
    read to its end, so a truncated file or a bad CRC is refused, as is anything outside ``limits``.
    """
    kept: dict[str, bytes] = {}
    count = 0
    try:
        with gzip.GzipFile(path) as gz:
            stream = _TarStream(gz, limits)
            with tarfile.open(fileobj=stream, mode="r:") as tf:
                for member in tf:
                    count += 1
                    if count > limits.members:
                        raise DistError(
                            f"the sdist has over {limits.members} members; the hub takes at most that"
                        )
                    if member.issparse():
                        raise DistError(f"{member.name} in the sdist is a sparse file")
                    if member.size > limits.member_bytes:
                        raise DistError(
                            f"member {member.name} is {_mib(member.size)}; the hub takes at most "
                            f"{_mib(limits.member_bytes)} per member"
                        )
                    keep = check(member)
                    if member.isfile():
                        stream.seek(member.offset_data)
                        chunks, left = [], member.size
                        while left > 0 and (chunk := stream.data(min(left, _CHUNK))):
                            left -= len(chunk)
                            if keep:
                                chunks.append(chunk)
                        if left:
                            raise DistError(f"not a valid sdist: member {member.name} is truncated")
                        if keep:
                            kept[member.name] = b"".join(chunks)
            stream.skip(limits.total_bytes + 1)  # to the end: gzip checks its CRC and length there
    except (tarfile.TarError, EOFError, zlib.error, OSError, RecursionError) as exc:
        raise DistError(f"not a valid sdist (.tar.gz): {exc}") from exc
    return kept

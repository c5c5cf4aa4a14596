"""What an upload may cost the hub: archive bombs, huge members, too many members, hostile tar headers.

The bombs are built cheaply: a deflate stream of zeros is one flushed 1 MiB block repeated (about
1 KiB per MiB), so a 1 GiB member is a 1 MiB file and nothing big is ever written or held.
"""

from __future__ import annotations

import gzip
import io
import random
import struct
import tarfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_hub_dist import INFO, SDIST_NAME, WHEEL_NAME, sdist_members, wheel_members, write_sdist, write_wheel

from palaestra.hub.archive import MAX_TAR_EXTENSION
from palaestra.hub.client import HubError, upload
from palaestra.hub.data import HubData
from palaestra.hub.dist import DistError, Limits, inspect_dist
from palaestra.testing.hub import running_hub

MiB = 1 << 20
DEFAULT = Limits()


def zeros(mib: int) -> bytes:
    """A raw deflate stream (no header, not final) that decompresses to ``mib`` MiB of zeros."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(MiB)) + c.flush(zlib.Z_FULL_FLUSH)  # byte-aligned, history reset: repeatable
    return block * mib


def deflate(data: bytes) -> bytes:
    """``data`` as a raw deflate stream that is not final, so more blocks may follow."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


FINAL = b"\x03\x00"  # an empty final block of fixed Huffman codes: the end of a deflate stream


@dataclass
class Member:
    name: str
    data: bytes  # as stored in the archive
    size: int  # declared decompressed size
    crc: int = 0
    method: int = 8  # deflate; 0: stored


def stored(name: str, text: str) -> Member:
    raw = text.encode()
    return Member(name, raw, len(raw), zlib.crc32(raw), 0)


def zip_file(members: list[Member], *, prefix: bytes = b"", entries: int | None = None) -> bytes:
    """A zip made by hand, so that it may declare what it likes; ``prefix`` comes before it."""
    out, directory = io.BytesIO(), io.BytesIO()
    out.write(prefix)
    for m in members:
        name = m.name.encode()
        offset = out.tell() - len(prefix)
        out.write(
            struct.pack(
                "<4s5H3L2H", b"PK\x03\x04", 20, 0, m.method, 0, 0, m.crc, len(m.data), m.size, len(name), 0
            )
            + name
            + m.data
        )
        directory.write(
            struct.pack(
                "<4s6H3L5H2L",
                b"PK\x01\x02",
                20,
                20,
                0,
                m.method,
                0,
                0,
                m.crc,
                len(m.data),
                m.size,
                len(name),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + name
        )
    start, cd = out.tell() - len(prefix), directory.getvalue()
    count = len(members) if entries is None else entries
    out.write(cd + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(cd), start, 0))
    return out.getvalue()


def valid_wheel_members() -> list[Member]:
    return [stored(name, text) for name, text in wheel_members().items()]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def refused(path: Path, match: str, limits: Limits = DEFAULT) -> None:
    with pytest.raises(DistError, match=match):
        inspect_dist(path, limits=limits)


# wheels


def test_a_1_gib_zip_bomb_in_a_1_mib_file_is_refused_by_the_default_limits(tmp_path: Path) -> None:
    bomb = Member("demo/data.bin", zeros(1024) + FINAL, 1024 * MiB)
    path = write(tmp_path / WHEEL_NAME, zip_file([*valid_wheel_members(), bomb]))
    assert path.stat().st_size < 1.1 * MiB
    started = time.monotonic()
    refused(path, r"member demo/data.bin is 1024 MiB decompressed; the hub takes at most 50 MiB per member")
    assert time.monotonic() - started < 1  # refused from the declared size: nothing was decompressed


def test_a_member_over_the_default_50_mib_is_refused(tmp_path: Path) -> None:
    big = Member("demo/data.bin", zeros(60) + FINAL, 60 * MiB, zlib.crc32(bytes(60 * MiB)))
    refused(write(tmp_path / WHEEL_NAME, zip_file([*valid_wheel_members(), big])), "is 60 MiB decompressed")


def test_members_each_under_the_limit_are_refused_together_over_the_default_256_mib(tmp_path: Path) -> None:
    crc = zlib.crc32(bytes(50 * MiB))
    parts = [Member(f"demo/part{i}.bin", zeros(50) + FINAL, 50 * MiB, crc) for i in range(6)]
    refused(
        write(tmp_path / WHEEL_NAME, zip_file([*valid_wheel_members(), *parts])),
        "the wheel is 300.0 MiB decompressed; the hub takes at most 256 MiB",
    )


def test_a_member_that_decompresses_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    liar = Member("demo/data.bin", zeros(4) + FINAL, 1000, zlib.crc32(bytes(1000)) ^ 1)
    refused(
        write(tmp_path / WHEEL_NAME, zip_file([*valid_wheel_members(), liar])), "corrupt member demo/data.bin"
    )


def test_too_many_members_are_refused_as_declared_and_as_found(tmp_path: Path) -> None:
    many = [*valid_wheel_members(), *(stored(f"demo/f{i}.py", "") for i in range(20))]
    limits = Limits(members=10)
    refused(
        write(tmp_path / WHEEL_NAME, zip_file(many)),
        "the wheel has 25 members; the hub takes at most 10",
        limits,
    )
    lying = write(tmp_path / WHEEL_NAME, zip_file(many, entries=3))  # ZipFile reads them all regardless
    refused(lying, "the wheel has 25 members; the hub takes at most 10", limits)
    # the default: 10,000
    default = [*valid_wheel_members(), *(stored(f"demo/f{i}", "") for i in range(10_000))]
    refused(
        write(tmp_path / WHEEL_NAME, zip_file(default)),
        "the wheel has 10005 members; the hub takes at most 10000",
    )


def test_a_central_directory_over_the_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    long_names = [*valid_wheel_members(), *(stored(f"demo/{i:04}{'x' * 900}", "") for i in range(10))]
    refused(
        write(tmp_path / WHEEL_NAME, zip_file(long_names)),
        "the wheel's list of members is .* bytes; the hub takes at most 4 KiB",
        Limits(directory_bytes=4096),
    )


def test_compression_methods_other_than_stored_and_deflate_are_refused(tmp_path: Path) -> None:
    members = valid_wheel_members()
    members[0].method = 12  # bzip2
    refused(
        write(tmp_path / WHEEL_NAME, zip_file(members)), "compressed with method 12: the hub takes stored or"
    )


def test_data_before_the_first_member_is_refused(tmp_path: Path) -> None:
    """A polyglot: JavaScript (or anything) before the zip, which ZipFile would read past."""
    script = b"window.pwned = 1; /*"
    path = write(tmp_path / WHEEL_NAME, zip_file(valid_wheel_members(), prefix=script))
    refused(path, "it has data before its first member")
    assert (
        inspect_dist(write(tmp_path / WHEEL_NAME, zip_file(valid_wheel_members()))).name
        == "palaestra-env-demo"
    )


def test_a_metadata_file_over_its_limit_is_refused(tmp_path: Path) -> None:
    members = wheel_members()
    members[f"{INFO}/METADATA"] += "x" * 2000
    refused(
        write_wheel(tmp_path / WHEEL_NAME, members),
        f"{INFO}/METADATA is 2... bytes; the hub reads at most 1000",
        Limits(metadata_bytes=1000),
    )


# sdists


def gzip_file(stream: bytes, *, size: int | None = None) -> bytes:
    """A gzip member around a raw deflate ``stream`` (its CRC is not computed: nothing reads that far)."""
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + stream + FINAL + struct.pack("<LL", 0, (size or 0) & 0xFFFFFFFF)


def tar_bytes(members: dict[str, str], *, end: bool = True) -> bytes:
    """A tar of ``members`` under the demo's top folder; ``end=False`` leaves out its end-of-archive blocks."""
    buffer = io.BytesIO()
    tf = tarfile.open(fileobj=buffer, mode="w")
    for name, text in members.items():
        data = text.encode()
        info = tarfile.TarInfo(f"palaestra_env_demo-0.2.0/{name}")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    content = buffer.getvalue()
    tf.close()
    return buffer.getvalue() if end else content


def test_a_1_gib_gzip_bomb_in_a_1_mib_file_is_refused_by_the_default_limits(tmp_path: Path) -> None:
    """A valid sdist whose gzip stream goes on with 1 GiB of zeros after the tar's end."""
    path = write(tmp_path / SDIST_NAME, gzip_file(deflate(tar_bytes(sdist_members())) + zeros(1024)))
    assert path.stat().st_size < 1.1 * MiB
    started = time.monotonic()
    refused(path, "the sdist is over 256 MiB decompressed")
    assert time.monotonic() - started < 5  # 256 MiB decompressed at most, not 1 GiB


def test_an_sdist_member_over_the_default_50_mib_is_refused_from_its_header(tmp_path: Path) -> None:
    info = tarfile.TarInfo("palaestra_env_demo-0.2.0/data.bin")
    info.size = 60 * MiB
    header = info.tobuf(tarfile.PAX_FORMAT)
    path = write(
        tmp_path / SDIST_NAME, gzip_file(deflate(tar_bytes(sdist_members(), end=False) + header) + zeros(61))
    )
    refused(
        path, "member palaestra_env_demo-0.2.0/data.bin is 60 MiB; the hub takes at most 50 MiB per member"
    )


def test_sdist_members_under_the_limit_are_refused_together_over_it(tmp_path: Path) -> None:
    members = {**sdist_members(), **{f"data{i}.txt": "x" * 3000 for i in range(4)}}
    refused(
        write_sdist(tmp_path / SDIST_NAME, members),
        "the sdist is over 10000 bytes decompressed",
        Limits(total_bytes=10_000),
    )


def test_too_many_sdist_members_are_refused(tmp_path: Path) -> None:
    members = {**sdist_members(), **{f"f{i}.py": "" for i in range(10)}}
    refused(write_sdist(tmp_path / SDIST_NAME, members), "the sdist has over 5 members", Limits(members=5))


def pax_sdist(path: Path, pax: dict[str, str], *, count: int = 1) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, text in sdist_members().items():
            data = text.encode()
            info = tarfile.TarInfo(f"palaestra_env_demo-0.2.0/{name}")
            info.size, info.pax_headers = len(data), pax
            for _ in range(count if name == "PKG-INFO" else 1):
                tf.addfile(info, io.BytesIO(data))
    return write(path, gzip.compress(buffer.getvalue()))


@pytest.mark.parametrize(
    ("pax", "match"),
    [
        # Python's tarfile takes quadratic time on these (CVE-2024-6232): refused before it parses them
        ({"comment": "1" * 60_000}, "a run of over 32 digits"),
        ({"comment": " hdrcharset=x" * 4000}, "hdrcharset twice"),
        ({"comment": "x" * (MAX_TAR_EXTENSION + 1)}, "a tar header over 64 KiB"),
    ],
    ids=["digits", "hdrcharset", "long"],
)
def test_hostile_tar_headers_are_refused_quickly(tmp_path: Path, pax: dict[str, str], match: str) -> None:
    started = time.monotonic()
    refused(pax_sdist(tmp_path / SDIST_NAME, pax), match)
    assert time.monotonic() - started < 1


def test_the_tar_headers_together_are_bounded(tmp_path: Path) -> None:
    path = pax_sdist(tmp_path / SDIST_NAME, {"comment": "x" * 20_000}, count=10)
    refused(path, "the sdist's tar headers are over 100000 bytes", Limits(header_bytes=100_000))
    assert inspect_dist(path).name == "palaestra-env-demo"  # the default takes 8 MiB of them


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO(tar_bytes(sdist_members()))
    data = bytearray(buffer.getvalue())
    data[156] = ord(tarfile.GNUTYPE_SPARSE)  # the first member's type flag
    data[148:156] = b"%06o\0 " % (sum(data[:148]) + 8 * 32 + sum(data[156:512]))  # its header checksum
    refused(write(tmp_path / SDIST_NAME, gzip_file(deflate(bytes(data)))), "is a sparse file")


def test_any_damage_to_an_archive_is_a_dist_error(tmp_path: Path) -> None:
    """Bytes flipped, cut or inserted anywhere: the answer is a refusal with a reason, never a crash."""
    deflated = tmp_path / "deflated.whl"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in wheel_members().items():
            zf.writestr(name, text)
    originals = {
        WHEEL_NAME: [write_wheel(tmp_path / "a.whl", wheel_members()).read_bytes(), deflated.read_bytes()],
        SDIST_NAME: [write_sdist(tmp_path / "a.tar.gz", sdist_members()).read_bytes()],
    }
    rng = random.Random(0)
    tried = 0
    for filename, datas in originals.items():
        for data in datas:
            for _ in range(300):
                damaged = bytearray(data)
                at = rng.randrange(len(damaged))
                how = rng.choice(["flip", "cut", "insert", "zero"])
                if how == "flip":
                    damaged[at] ^= 1 << rng.randrange(8)
                elif how == "cut":
                    del damaged[at:]
                elif how == "insert":
                    damaged[at:at] = rng.randbytes(rng.randrange(1, 8))
                else:
                    damaged[at : at + 4] = b"\xff\xff\xff\xff"
                path = write(tmp_path / filename, bytes(damaged))
                try:
                    inspect_dist(path)
                except DistError:
                    tried += 1
    assert tried > 500  # most damage is caught (a flip inside an unused name or a comment may not be)


async def test_bombs_sent_to_a_hub_with_its_default_limits_are_refused_and_leave_nothing(
    tmp_path: Path,
) -> None:
    data = HubData(tmp_path / "data")
    data.catalog.add_user("alice")
    token = data.catalog.new_token("alice")
    (tmp_path / "zip").mkdir()
    (tmp_path / "gz").mkdir()
    zip_bomb = write(
        tmp_path / "zip" / WHEEL_NAME,
        zip_file([*valid_wheel_members(), Member("demo/data.bin", zeros(1024) + FINAL, 1024 * MiB)]),
    )
    gzip_bomb = write(
        tmp_path / "gz" / SDIST_NAME, gzip_file(deflate(tar_bytes(sdist_members())) + zeros(1024))
    )
    async with running_hub(data.root) as url:  # the default upload limit: 100 MiB
        for path, message in (
            (zip_bomb, "is 1024 MiB decompressed"),
            (gzip_bomb, "over 256 MiB decompressed"),
        ):
            with pytest.raises(HubError, match=f"400 .*{message}"):
                await upload(url, token, [path])
        assert data.catalog.filenames() == set() and not any(data.tmp.iterdir())
        assert not any((data.root / "files").iterdir())

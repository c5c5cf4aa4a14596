"""Inspect one uploaded distribution file (wheel or sdist) for the hub, before anything is stored.

The hub serves environment packages: projects named ``palaestra-env-*`` that expose at least one
``palaestra.environments`` entry point; and ``palaestra`` itself (which exposes its own), so that
the environments' install lines work on a machine with only the hub and an index for the rest. ``inspect_dist`` checks that an upload is an intact archive,
safe to unpack, whose core metadata agrees with its filename and which declares an environment,
and returns what the hub's catalog and pages need. Every refusal is one ``DistError`` whose message
tells the uploader what to fix. Nothing is extracted, and the archive is read within ``Limits``
(``palaestra.hub.archive``), so a hostile archive (a zip or gzip bomb, a huge member, millions of
members) costs the hub a bounded amount of memory and time.
"""

from __future__ import annotations

import configparser
import hashlib
import posixpath
import re
import tarfile
import tomllib
from dataclasses import dataclass, field
from email.parser import Parser
from email.policy import compat32
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, Literal

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from palaestra.hub.archive import DistError, Limits, read_sdist, read_wheel

__all__ = [
    "DEFAULT_LIMITS",
    "DistError",
    "DistInfo",
    "Limits",
    "check_project_name",
    "inspect_dist",
    "is_hub_name",
    "normalize",
]

PREFIX = "palaestra-env-"
FRAMEWORK = "palaestra"  # the one project outside PREFIX: what every environment depends on
ENTRY_POINT_GROUP = "palaestra.environments"
DEFAULT_LIMITS = Limits()
MAX_FILENAME = 240  # a file name on disk, with ".metadata" after it, stays under 255 bytes
_CHUNK = 1024 * 1024
# what the names of wheels and sdists are made of (PEP 427, PEP 625): a name outside it is refused
_FILENAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]*")
_PEP508_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]", re.IGNORECASE)
_HOW_TO_DECLARE = f'add [project.entry-points."{ENTRY_POINT_GROUP}"] to pyproject.toml'


@dataclass(frozen=True)
class DistInfo:
    """What the hub keeps of a valid upload."""

    filename: str  # the file's basename as uploaded
    kind: Literal["wheel", "sdist"]
    name: str  # normalized project name (PEP 503)
    display_name: str  # the Name: field as written in the metadata
    version: str  # normalized: str(Version(v))
    sha256: str  # hex digest of the whole file
    size: int
    metadata: bytes  # the raw core metadata file (wheel: *.dist-info/METADATA; sdist: PKG-INFO)
    summary: str
    description: str  # long description, "" if none
    description_content_type: str  # "" if absent
    keywords: tuple[str, ...]
    requires_dist: tuple[str, ...]
    requires_python: str  # "" if absent
    environments: tuple[str, ...]  # entry point names in ENTRY_POINT_GROUP, sorted
    eval_defaults: dict[str, Any] = field(hash=False)  # sdist: pyproject's [tool.palaestra.eval]; wheel: {}
    project_urls: tuple[tuple[str, str], ...]  # (label, url) from Project-URL fields
    license: str  # License-Expression or License, "" if absent


def normalize(name: str) -> str:
    """The PEP 503 form of a project name: runs of ``-_.`` become ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_hub_name(normalized: str) -> bool:
    """Whether a normalized project name is one a hub serves: ``palaestra-env-*`` or ``palaestra``."""
    return normalized == FRAMEWORK or (normalized.startswith(PREFIX) and len(normalized) > len(PREFIX))


def check_project_name(name: str) -> str:
    """Return the normalized name; DistError unless it is a valid PEP 508 name the hub serves."""
    normalized = normalize(name)
    if _PEP508_NAME.fullmatch(name) and is_hub_name(normalized):
        return normalized
    rest = re.sub(r"^palaestra(-env)?(-|$)", "", re.sub(r"[^a-z0-9]+", "-", normalized).strip("-"))
    raise DistError(
        f"{name!r} is not a valid environment package name: environment packages are Python projects "
        f"named {PREFIX!r} + a name, e.g. {PREFIX + (rest or 'foo')!r}"
    )


def inspect_dist(path: Path, *, filename: str | None = None, limits: Limits = DEFAULT_LIMITS) -> DistInfo:
    """Validate the wheel or sdist at ``path`` (uploaded as ``filename``) and read what the hub needs."""
    filename = path.name if filename is None else filename
    kind: Literal["wheel", "sdist"]
    if filename.endswith(".whl"):
        kind = "wheel"
    elif filename.endswith(".tar.gz"):
        kind = "sdist"
    else:
        raise DistError(
            f"{filename[:MAX_FILENAME]!r}: only wheels (.whl) and sdists (.tar.gz) can be uploaded"
        )
    if not _FILENAME.fullmatch(filename) or len(filename) > MAX_FILENAME:
        raise DistError(
            f"{filename[:MAX_FILENAME]!r} is not a plain file name: a wheel or sdist is named with letters, "
            f"digits and ._+!- only, in at most {MAX_FILENAME} characters"
        )
    try:
        if kind == "wheel":
            file_name, file_version = parse_wheel_filename(filename)[:2]
        else:
            file_name, file_version = parse_sdist_filename(filename)
    except (
        ValueError
    ) as exc:  # InvalidWheelFilename, InvalidSdistFilename, InvalidVersion, int() of 5000 digits
        raise DistError(f"invalid {kind} file name: {exc}") from exc
    check_project_name(file_name)

    sha256, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha256.update(chunk)
            size += len(chunk)

    eval_defaults: dict[str, Any] = {}
    if kind == "wheel":
        metadata, environments = _read_wheel(path, limits)
    else:
        metadata, environments, eval_defaults = _read_sdist(path, limits)
    fields = _parse_metadata(metadata, "METADATA" if kind == "wheel" else "PKG-INFO")
    if canonicalize_name(fields["name"]) != file_name or Version(fields["version"]) != file_version:
        raise DistError(
            f"the metadata says {fields['display_name']} {fields['version']} but the file name says "
            f"{file_name} {file_version}: rebuild the {kind} rather than renaming it"
        )
    return DistInfo(
        filename=filename,
        kind=kind,
        sha256=sha256.hexdigest(),
        size=size,
        metadata=metadata,
        environments=environments,
        eval_defaults=eval_defaults,
        **fields,
    )


def _member_parts(name: str, kind: str) -> list[str]:
    """The path components of an archive member; DistError if it is absolute or climbs out with ``..``."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name) or ".." in parts:
        raise DistError(
            f"unsafe member name in the {kind}: {name!r} (absolute, empty or with a '..' component)"
        )
    return parts


def _environments(entries: dict[str, Any], where: str) -> tuple[str, ...]:
    """The sorted entry point names of the environments group; DistError unless well-formed and non-empty."""
    if not entries:
        raise DistError(f"the {where} declares no {ENTRY_POINT_GROUP} entry point: {_HOW_TO_DECLARE}")
    for name, value in entries.items():
        if not name.strip() or not isinstance(value, str) or not EntryPoint.pattern.match(value.strip()):
            raise DistError(
                f"bad {ENTRY_POINT_GROUP} entry point {name!r} = {value!r}: expected 'module:function'"
            )
    return tuple(sorted(name.strip() for name in entries))


class _EntryPointsParser(configparser.ConfigParser):
    """entry_points.txt as importlib.metadata reads it: ``=`` only, no interpolation, names keep their case."""

    def __init__(self) -> None:
        super().__init__(delimiters=("=",), interpolation=None)

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def _small(kept: dict[str, bytes], limits: Limits) -> dict[str, bytes]:
    """``kept``, unless a file the hub parses and stores is over ``limits.metadata_bytes``."""
    for name, content in kept.items():
        if len(content) > limits.metadata_bytes:
            raise DistError(
                f"{name} is {len(content)} bytes; the hub reads at most {limits.metadata_bytes} (a long README?)"
            )
    return kept


def _read_wheel(path: Path, limits: Limits) -> tuple[bytes, tuple[str, ...]]:
    """The wheel's METADATA and environment names, after checking every member's path and CRC."""
    dist_info = ""

    def choose(names: list[str]) -> list[str]:
        nonlocal dist_info
        tops = {_member_parts(name, "wheel")[0] for name in names}
        dist_infos = sorted(top for top in tops if top.endswith(".dist-info"))
        if len(dist_infos) != 1:
            raise DistError(f"a wheel must have exactly one top-level *.dist-info folder, not {dist_infos}")
        dist_info = dist_infos[0]
        return [f"{dist_info}/{name}" for name in ("METADATA", "WHEEL", "entry_points.txt")]

    kept = _small(read_wheel(path, limits, choose)[1], limits)
    metadata, wheel = kept.get(f"{dist_info}/METADATA"), kept.get(f"{dist_info}/WHEEL")
    entry_points = kept.get(f"{dist_info}/entry_points.txt", b"")
    if metadata is None or wheel is None:
        raise DistError(f"not a valid wheel: {dist_info}/ must contain METADATA and WHEEL")
    parser = _EntryPointsParser()
    try:
        parser.read_string(entry_points.decode())
    except (UnicodeDecodeError, configparser.Error) as exc:
        raise DistError(f"the wheel's entry_points.txt cannot be read: {exc}") from exc
    group = dict(parser[ENTRY_POINT_GROUP]) if parser.has_section(ENTRY_POINT_GROUP) else {}
    return metadata, _environments(group, "wheel")


def _read_sdist(path: Path, limits: Limits) -> tuple[bytes, tuple[str, ...], dict[str, Any]]:
    """The sdist's PKG-INFO, environment names and eval defaults, after reading every member through."""
    top: str | None = None

    def check(member: tarfile.TarInfo) -> bool:
        nonlocal top
        parts = _member_parts(member.name, "sdist")
        if top is None:
            top = parts[0]
        elif parts[0] != top:
            raise DistError(f"an sdist must have exactly one top-level folder, not {top!r} and {parts[0]!r}")
        if member.issym() or member.islnk():
            base = posixpath.dirname(member.name) if member.issym() else ""
            target = posixpath.normpath(posixpath.join(base, member.linkname))
            if member.linkname.startswith("/") or target.split("/")[0] != top:
                raise DistError(f"link {member.name} -> {member.linkname} points outside the sdist")
        elif not member.isfile() and not member.isdir():
            raise DistError(f"{member.name} in the sdist is neither a file, a folder nor a link")
        return member.isfile() and "/".join(parts[1:]) in ("PKG-INFO", "pyproject.toml")

    found = _small(read_sdist(path, limits, check), limits)
    kept = {"/".join(_member_parts(name, "sdist")[1:]): content for name, content in found.items()}
    if top is None:
        raise DistError("the sdist is empty")
    if "PKG-INFO" not in kept or "pyproject.toml" not in kept:
        raise DistError(f"not a valid sdist: it must contain {top}/PKG-INFO and {top}/pyproject.toml")
    try:
        pyproject = tomllib.loads(kept["pyproject.toml"].decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DistError(f"the sdist's pyproject.toml cannot be read: {exc}") from exc
    group = _table(pyproject, "project", "entry-points", ENTRY_POINT_GROUP)
    return (
        kept["PKG-INFO"],
        _environments(group, "sdist's pyproject.toml"),
        _table(pyproject, "tool", "palaestra", "eval"),
    )


def _table(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The TOML table at ``keys`` ({} if absent); DistError if something on the way is not a table."""
    for i, key in enumerate(keys):
        data = data.get(key, {})
        if not isinstance(data, dict):
            raise DistError(f"pyproject.toml: [{'.'.join(keys[: i + 1])}] must be a table")
    return data


def _parse_metadata(raw: bytes, source: str) -> dict[str, Any]:
    """The DistInfo fields that come from core metadata (an email-style header block and body)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise DistError(f"{source} is not UTF-8: {exc}") from exc
    msg = Parser(policy=compat32).parsestr(text)

    def one(key: str) -> str:
        value = msg.get(key)
        return "" if value is None else str(value).strip()

    def many(key: str) -> tuple[str, ...]:
        return tuple(v for v in (str(v).strip() for v in msg.get_all(key) or []) if v)

    missing = [key for key in ("Metadata-Version", "Name", "Version") if not one(key)]
    if missing:
        raise DistError(f"{source} lacks the required field(s) {', '.join(missing)}")
    try:
        version = str(Version(one("Version")))
    except ValueError as exc:  # InvalidVersion, or a number too long for int()
        raise DistError(f"{source}: {exc}") from exc
    body = msg.get_payload()
    description = body if isinstance(body, str) and body.strip() else ""
    if not description and one("Description"):  # older metadata: a header, continuation lines indented
        first, *rest = str(msg.get("Description")).strip().splitlines()
        description = "\n".join([first, *(re.sub(r"^( {8}|\t)\|?", "", line) for line in rest)])
    keywords = one("Keywords")
    urls = [url.partition(",") for url in many("Project-URL")]
    return {
        "name": check_project_name(one("Name")),
        "display_name": one("Name"),
        "version": version,
        "summary": one("Summary"),
        "description": description,
        "description_content_type": one("Description-Content-Type"),
        "keywords": tuple(
            k.strip() for k in re.split("," if "," in keywords else r"\s+", keywords) if k.strip()
        ),
        "requires_dist": many("Requires-Dist"),
        "requires_python": one("Requires-Python"),
        "project_urls": tuple(
            (label.strip(), url.strip()) if sep else ("", label.strip()) for label, sep, url in urls
        ),
        "license": one("License-Expression") or one("License"),
    }

"""Scaffold a new environment package: ``palaestra init NAME`` calls ``create_environment``.

The files come from ``palaestra/templates/``: plain text with ``{{name}}``, ``{{module}}``,
``{{package}}``, ``{{class}}`` and ``{{task}}`` markers, filled with ``str.replace`` (not ``str.format``, which would trip on the
braces of the Python code inside). The generated package works as generated: its test passes
before you change anything.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

NAME_PATTERN = re.compile(r"[a-z](?:[a-z0-9_-]*[a-z0-9])?")

# per kind: template file -> path in the new package ("{{module}}" is replaced in the path too)
KINDS = {
    "single": {
        "pyproject.toml.tmpl": "pyproject.toml",
        "environment.py.tmpl": "{{module}}.py",
        "README.md.tmpl": "README.md",
        "test_environment.py.tmpl": "tests/test_{{module}}_env.py",
    },
    "multiturn": {
        "pyproject.toml.tmpl": "pyproject.toml",
        "multiturn_environment.py.tmpl": "{{module}}.py",
        "README_multiturn.md.tmpl": "README.md",
        "test_multiturn_environment.py.tmpl": "tests/test_{{module}}_env.py",
    },
    "tool": {
        "pyproject.toml.tmpl": "pyproject.toml",
        "tool_environment.py.tmpl": "{{module}}.py",
        "README.md.tmpl": "README.md",
        "test_tool_environment.py.tmpl": "tests/test_{{module}}_env.py",
    },
}
TEMPLATES = {template: path for kind in KINDS.values() for template, path in kind.items()}  # every file
TASKS = {  # the README's "{{task}}": what the generated package does
    "single": "a small single-turn task — name a country's capital —",
    "multiturn": 'a small multi-turn game — guess a number from "higher" and "lower" hints —',
    "tool": "a small tool-using task — look a country up with a tool, then answer —",
}


@dataclass(frozen=True)
class EnvironmentNames:
    """The spellings of one environment name: as given, as a module, as a distribution."""

    name: str  # as given: "my-env"
    module: str  # the Python module, entry point and folder name: "my_env"
    package: str  # the distribution name: "palaestra-env-my-env" (the hub's prefix)


def environment_names(name: str) -> EnvironmentNames:
    """Validate ``name`` and derive its module and package names; ``ValueError`` says what is wrong."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"invalid environment name {name!r}: use lower-case letters, digits, '_' or '-', "
            "starting with a letter and ending with a letter or digit (e.g. 'word_count' or 'word-count')"
        )
    module = name.replace("-", "_")
    if keyword.iskeyword(module) or keyword.issoftkeyword(module):
        raise ValueError(f"invalid environment name {name!r}: {module!r} is a Python keyword")
    if module in sys.stdlib_module_names or module in ("palaestra", "pa"):
        raise ValueError(f"invalid environment name {name!r}: it would shadow the module {module!r}")
    return EnvironmentNames(name=name, module=module, package="palaestra-env-" + module.replace("_", "-"))


def render(template: str, names: EnvironmentNames, kind: str = "single") -> str:
    """The text of ``template`` (a file in ``palaestra/templates``) with its markers filled in."""
    text = resources.files("palaestra").joinpath("templates", template).read_text(encoding="utf-8")
    return _fill(text, names, kind)


def _fill(text: str, names: EnvironmentNames, kind: str = "single") -> str:
    for marker, value in (
        ("{{name}}", names.name),
        ("{{module}}", names.module),
        ("{{package}}", names.package),
        ("{{task}}", TASKS[kind]),
        ("{{class}}", "".join(part.capitalize() for part in names.module.split("_")) + "Env"),
        ("{{init}}", f"palaestra init {names.name}" + ("" if kind == "single" else f" --kind {kind}")),
        ("{{arguments}}", "\n| `max_turns` | `4` | model replies per rollout |" if kind == "tool" else ""),
    ):
        text = text.replace(marker, value)
    if "{{" in text:
        raise RuntimeError(f"unfilled marker in a template: {text[text.index('{{') :][:40]!r}")
    return text


def create_environment(name: str, parent: Path, kind: str = "single") -> Path:
    """Create the environment package ``parent/<module>/`` and return its path.

    ``kind`` is ``single`` (a single-turn task), ``multiturn`` (a ``MultiTurnEnv`` game) or ``tool``
    (a ``ToolEnv`` with one tool). Raises
    ``ValueError`` for an invalid name (or one that would shadow an importable module) or kind,
    and ``FileExistsError`` if the folder exists: nothing is ever overwritten.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: choose one of {', '.join(KINDS)}")
    names = environment_names(name)
    parent = Path(parent)
    target = parent / names.module
    if target.exists():
        raise FileExistsError(f"{target} already exists; choose another name or folder (nothing was changed)")
    spec = importlib.util.find_spec(names.module)
    if spec is not None and spec.origin is not None:
        raise ValueError(
            f"invalid environment name {name!r}: a module {names.module!r} is already importable "
            f"({spec.origin}); choose another name"
        )
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(f"{parent} is not a directory")
    files = {
        _fill(dest, names, kind): render(template, names, kind) for template, dest in KINDS[kind].items()
    }
    parent.mkdir(parents=True, exist_ok=True)
    target.mkdir()  # fails if the folder appeared meanwhile
    try:
        for relative, text in files.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("x", encoding="utf-8") as f:
                f.write(text)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # no half-made package left behind
        raise
    return target

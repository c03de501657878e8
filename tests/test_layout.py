"""docs/architecture.md's module map is THE map of the code: it names every ``.py`` and
``.lua`` file under ``ftlayer/``, ``partitioners/`` and ``serialization/``, and every file
it names exists (adding, renaming or deleting a module without updating the map fails
here). The package docstring points at it instead of keeping a second map."""

from __future__ import annotations

import re
from pathlib import Path

import ftlayer

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("ftlayer", "partitioners", "serialization")
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)  # a table row's first cell


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``)."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"docs/architecture.md has no '## {heading}' section"
    return m.group(1)


def map_entries(text: str) -> list[str]:
    """The files the module map names: the first cell of each of its table rows."""
    return _ROW.findall(_section(text, "Module map"))


def source_files(root: Path) -> set[str]:
    """Every ``.py`` and ``.lua`` file of the three packages, relative to ``root``."""
    return {
        p.relative_to(root).as_posix()
        for pkg in PACKAGES
        for p in (root / pkg).rglob("*")
        if p.suffix in (".py", ".lua") and "__pycache__" not in p.parts
    }


def missing_from_map(text: str, root: Path) -> list[str]:
    return sorted(source_files(root) - set(map_entries(text)))


def named_but_absent(text: str, root: Path) -> list[str]:
    return sorted(n for n in map_entries(text) if not (root / n).is_file())


def test_the_map_names_every_module() -> None:
    text = ARCHITECTURE.read_text()
    missing = missing_from_map(text, ROOT)
    assert not missing, f"not in docs/architecture.md's module map: {missing}"


def test_every_file_the_map_names_exists() -> None:
    text = ARCHITECTURE.read_text()
    entries = map_entries(text)
    assert len(entries) > 80  # the map was found and parsed
    assert len(entries) == len(set(entries)), "a file is named twice in the module map"
    absent = named_but_absent(text, ROOT)
    assert not absent, f"docs/architecture.md's module map names missing files: {absent}"


def test_the_checks_fail_on_a_renamed_module() -> None:
    """The two checks above would catch a map that drifted from the tree."""
    text = ARCHITECTURE.read_text()
    drifted = text.replace("| `ftlayer/acker.py` |", "| `ftlayer/ackers.py` |")
    assert drifted != text
    new_missing = set(missing_from_map(drifted, ROOT)) - set(missing_from_map(text, ROOT))
    new_absent = set(named_but_absent(drifted, ROOT)) - set(named_but_absent(text, ROOT))
    assert new_missing == {"ftlayer/acker.py"} and new_absent == {"ftlayer/ackers.py"}


def test_the_package_docstring_points_at_the_map() -> None:
    doc = ftlayer.__doc__ or ""
    assert "docs/architecture.md" in doc
    assert not re.search(r"``[\w/]+\.(?:py|lua)``", doc), "a second module map in ftlayer/__init__"


LONGEST_CLASS, LONGEST_FUNCTION = 250, 60
"""The batch engine's size limits (ftlayer/spark/: one module a phase, short parts)."""


def too_long(root: Path) -> list[str]:
    """Classes over LONGEST_CLASS lines and functions over LONGEST_FUNCTION (docstrings
    and comments included) under ``root``, as ``file:line name: lines``."""
    import ast

    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                limit = LONGEST_CLASS
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = LONGEST_FUNCTION
            else:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name}: "
                           f"{lines}")  # fmt: skip
    return out


def test_the_spark_engine_has_no_long_class_or_function() -> None:
    """Catches: a phase growing back into one long class or function."""
    found = too_long(ROOT / "ftlayer" / "spark")
    assert not found, found


def test_the_length_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n\ndef g():\n    pass\n")
    assert too_long(tmp_path) == [f"m.py:1 f: {LONGEST_FUNCTION + 1}"]

"""The package docstring maps the design's concepts to files: it names every module of
``ftlayer/`` and every file it names exists (renaming or adding a module without updating
the map fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import ftlayer

ROOT = Path(ftlayer.__file__).parent


def _named() -> set[str]:
    return set(re.findall(r"``([\w/*.]+\.(?:py|lua)|[\w]+/)``", ftlayer.__doc__ or ""))


def test_every_file_the_map_names_exists() -> None:
    named = _named()
    assert len(named) > 20
    for name in named:
        assert list(ROOT.glob(name)) or (ROOT.parent / name).exists(), name


def test_every_module_is_on_the_map() -> None:
    named = _named()
    for path in sorted(ROOT.glob("*.py")):
        if path.name != "__init__.py":
            assert path.name in named, f"{path.name} is not in ftlayer's package docstring"
    for pkg in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").exists()):
        assert f"{pkg.name}/" in named or any(n.startswith(f"{pkg.name}/") for n in named), pkg

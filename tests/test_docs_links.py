"""The repository stands alone, and its documents point at what exists:

* every invariant cited by number anywhere (code, tests, scripts, docs) is defined in
  docs/architecture.md's "Invariants" section, which numbers them 1..N once each;
* no file refers to a design document outside the repository;
* every relative Markdown link (README.md, docs/*.md, any other .md) points to a file that
  exists, and to a heading that exists when it names one;
* every repository path docs/architecture.md spells in backticks exists.

Each check is a function of a text (or a tree), so the ``*_can_fail`` tests feed it a
broken one and watch it complain.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# what .gitignore keeps out of the repository (and .git itself)
_SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
              ".hypothesis", "build", "dist", "spark-warehouse", "metastore_db"}  # fmt: skip
_TEXT = {".py", ".md", ".lua", ".txt", ".cfg", ".toml", ".yml", ".yaml", ".json", ".sh",
         ".service", ".env", ".ini"}  # fmt: skip


def repo_files(root: Path = ROOT) -> list[Path]:
    """Every file of the repository: what git would see, without ignored build output."""
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel):
            continue
        if p.is_file():
            out.append(p)
    return sorted(out)


def _text_files(root: Path = ROOT) -> list[Path]:
    return [p for p in repo_files(root) if p.suffix in _TEXT or p.name in ("Dockerfile", "run")]


# -- invariants ---------------------------------------------------------------------------
_NUMBERS = r"\d+(?:\s*(?:,\s*and|,|and|or|&|-|–)\s*\d+)*"
_CITE = re.compile(rf"\binvariants?\s+(?:#\s*)?({_NUMBERS})|\binv\.\s*({_NUMBERS})", re.I)
# a citation may wrap: a newline, indentation and a comment marker read as one space
_WRAP = re.compile(r"\s*\n\s*(?:#+|--+|//|\*)?\s*")


def cited_numbers(text: str) -> set[int]:
    """The invariant numbers ``text`` cites: "invariant 3", "invariants 2 and 4",
    "Invariants 1, 6, 7 and 8", "invariants 1-3", "(inv. 5)", across a line break too."""
    out: set[int] = set()
    for m in _CITE.finditer(_WRAP.sub(" ", text)):
        spec = m.group(1) or m.group(2)
        for a, b in re.findall(r"(\d+)(?:\s*[-–]\s*(\d+))?", spec):
            out.update(range(int(a), int(b or a) + 1))
    return out


def defined_numbers(text: str) -> list[int]:
    """The invariants docs/architecture.md defines: the ``### N. Title`` headings of its
    ``## Invariants`` section, in order."""
    m = re.search(r"^## Invariants\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "docs/architecture.md has no '## Invariants' section"
    return [int(n) for n in re.findall(r"^### (\d+)\. \S", m.group(1), re.M)]


def citations(root: Path = ROOT) -> dict[str, set[int]]:
    """Each file that cites an invariant, with the numbers it cites."""
    out = {}
    for p in _text_files(root):
        found = cited_numbers(p.read_text(errors="replace"))
        if found:
            out[p.relative_to(root).as_posix()] = found
    return out


def undefined_citations(cited: dict[str, set[int]], defined: list[int]) -> dict[str, set[int]]:
    return {f: nums - set(defined) for f, nums in cited.items() if nums - set(defined)}


def test_the_invariants_are_numbered_once_each_from_1() -> None:
    defined = defined_numbers(ARCHITECTURE.read_text())
    assert defined == list(range(1, len(defined) + 1)), defined
    assert len(defined) >= 11


def test_every_cited_invariant_is_defined_in_architecture_md() -> None:
    cited = citations()
    assert len(cited) > 15  # the scan finds the code's citations
    for where in ("ftlayer/lua/flush.lua", "ftlayer/handler.py", "docs/storage-layout.md"):
        assert where in cited, f"no invariant citation found in {where}"
    missing = undefined_citations(cited, defined_numbers(ARCHITECTURE.read_text()))
    assert not missing, f"invariants cited but not defined in docs/architecture.md: {missing}"


def test_the_invariant_checks_can_fail() -> None:
    assert cited_numbers("see invariants 2 and 4") == {2, 4}
    assert cited_numbers("Invariants 1, 6, 7 and 8.") == {1, 6, 7, 8}
    assert cited_numbers("a live timeout (invariant\n    1). A task") == {1}
    assert cited_numbers("-- FTLayer.fail (invariants 5,\n-- 6, 8): retire") == {5, 6, 8}
    assert cited_numbers("(inv. 3) and invariants 9-11") == {3, 9, 10, 11}
    assert cited_numbers("kept for the invariant\n    if zero.any():") == set()
    defined = defined_numbers(ARCHITECTURE.read_text())
    assert undefined_citations({"x.py": {3, len(defined) + 1}}, defined) == {
        "x.py": {len(defined) + 1}
    }
    gap = ARCHITECTURE.read_text().replace("\n### 2. ", "\n### 22. ", 1)
    assert defined_numbers(gap) != list(range(1, len(defined_numbers(gap)) + 1))


# -- nothing outside the repository -------------------------------------------------------
# spelled in pieces, so that this file does not mention them itself
_OUTSIDE = tuple(
    "".join(parts)
    for parts in (("..", "/shared"), ("/work", "/shared"), ("shared", "/DESIGN"),
                  ("DESIGN", ".md"), ("design", "-notes.md"))
)  # fmt: skip


def outside_mentions(files: list[Path], root: Path = ROOT) -> list[str]:
    out = []
    for p in files:
        data = p.read_bytes()
        out += [f"{p.relative_to(root).as_posix()}: {s}" for s in _OUTSIDE if s.encode() in data]
    return out


def test_no_file_refers_to_a_design_outside_the_repository() -> None:
    files = repo_files()
    assert any(p.name == "architecture.md" for p in files)
    found = outside_mentions(files)
    assert not found, f"the repository must stand alone: {found}"


def test_the_outside_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text(f"as {_OUTSIDE[3]} says")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(_OUTSIDE[4].encode())  # ignored
    assert outside_mentions(repo_files(tmp_path), tmp_path) == [f"notes.md: {_OUTSIDE[3]}"]


# -- links --------------------------------------------------------------------------------
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())  # a link's text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = _FENCE.sub("", md.read_text())
    out: set[str] = set()
    for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s, n = slug(h), 1
        while s in out:  # GitHub numbers repeated headings
            s = f"{slug(h)}-{n}"
            n += 1
        out.add(s)
    return out


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``md`` whose file (or heading) does not exist."""
    out = []
    for target in _LINK.findall(_FENCE.sub("", md.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists() or root.resolve() not in (dest, *dest.parents):
            out.append(f"{md.relative_to(root).as_posix()}: {target} (no such file)")
        elif frag and dest.suffix == ".md" and frag.lower() not in anchors(dest):
            out.append(f"{md.relative_to(root).as_posix()}: {target} (no such heading)")
    return out


def _markdown(root: Path = ROOT) -> list[Path]:
    return [p for p in repo_files(root) if p.suffix == ".md"]


def test_every_relative_markdown_link_resolves() -> None:
    docs = _markdown()
    assert ROOT / "README.md" in docs and ARCHITECTURE in docs
    broken = [b for md in docs for b in broken_links(md)]
    assert not broken, broken


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Section two\n")
    md = tmp_path / "docs" / "a.md"
    md.write_text("[ok](b.md) [ok](b.md#section-two) [ok](#a) [web](https://x.y/z)\n"
                  "# A\n[gone](missing.md) [bad](b.md#nope) [out](../../../etc/passwd)\n"
                  "```\n[in a fence](nowhere.md)\n```\n")  # fmt: skip
    assert broken_links(md, tmp_path) == [
        "docs/a.md: missing.md (no such file)",
        "docs/a.md: b.md#nope (no such heading)",
        "docs/a.md: ../../../etc/passwd (no such file)",
    ]


# -- paths in architecture.md -------------------------------------------------------------
_PATH = re.compile(r"`((?:ftlayer|partitioners|serialization|tests|docs|benchmarks|deploy|"
                   r"examples)/[\w./-]+?\.(?:py|lua|md|json|yml|yaml))(?:::\w+)?`")  # fmt: skip


def absent_paths(text: str, root: Path = ROOT) -> list[str]:
    return sorted({p for p in _PATH.findall(text) if not (root / p).is_file()})


def test_every_path_architecture_md_names_exists() -> None:
    text = ARCHITECTURE.read_text()
    assert len(_PATH.findall(text)) > 100
    absent = absent_paths(text)
    assert not absent, f"docs/architecture.md names files that do not exist: {absent}"


def test_the_path_check_can_fail() -> None:
    assert absent_paths("`tests/test_acker.py::test_x` and `tests/test_nothing_here.py`") == [
        "tests/test_nothing_here.py"
    ]

"""docs/configuration.md is what ftlayer.reference generates from the code: every setting
with its default and meaning. A changed setting, default or docstring makes the committed
page stale (regenerate it), and a setting the code gives no meaning fails the generation."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

import ftlayer.config
from ftlayer import reference
from ftlayer.config import FTConfig
from ftlayer.spark import FaultTolerance

COMMITTED = reference.DOC_PATH
REGENERATE = f"docs/configuration.md is out of date: run `{reference.COMMAND}`"


def _table(text: str, heading: str) -> dict[str, dict[str, str]]:
    """The table right under ``heading``: each row's cells by column, keyed by its name
    (backquotes and Markdown escapes taken off)."""
    lines = text.split(f"\n{heading}\n", 1)[1].splitlines()
    rows = [ln for ln in lines[: next(i for i, ln in enumerate(lines) if ln.startswith("#"))]
            if ln.startswith("|")]  # fmt: skip

    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        return [p.strip().replace("\\|", "|") for p in parts]

    head = cells(rows[0])
    out = {}
    for row in rows[2:]:
        values = dict(zip(head, cells(row), strict=True))
        out[values["name"].strip("`")] = values
    return out


def test_committed_page_is_what_the_code_generates() -> None:
    assert COMMITTED.exists(), REGENERATE
    assert reference.render() == COMMITTED.read_text(), REGENERATE


def test_every_ftconfig_field_is_listed_with_its_default_as_repr() -> None:
    rows = _table(COMMITTED.read_text(), "## FTConfig")
    for f in dataclasses.fields(FTConfig):
        assert f.name in rows, f"FTConfig.{f.name} is not on the page: {REGENERATE}"
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        assert rows[f.name]["default"] == f"`{default!r}`", f"FTConfig.{f.name}: {REGENERATE}"
        assert rows[f.name]["meaning"], f.name


def test_every_parameter_of_pipeline_is_listed() -> None:
    rows = _table(COMMITTED.read_text(), "## FaultTolerance.pipeline")
    params = [p for p in inspect.signature(FaultTolerance.pipeline).parameters if p != "self"]
    assert params
    for name in params:
        assert name in rows, f"ft.pipeline({name}=...) is not on the page: {REGENERATE}"
        assert rows[name]["meaning"], name


def test_check_exits_1_with_a_diff_and_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "configuration.md"
    page.write_text(reference.render())
    assert reference.main(["--check", "--output", str(page)]) == 0
    page.write_text(page.read_text().replace("| `max_replays` | `int` | `3` |",
                                             "| `max_replays` | `int` | `4` |"))  # fmt: skip
    capsys.readouterr()
    assert reference.main(["--check", "--output", str(page)]) == 1
    out, err = capsys.readouterr()
    assert "-| `max_replays` | `int` | `4` |" in out and "+| `max_replays` | `int` | `3` |" in out
    assert reference.COMMAND in err


def _config_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str) -> type:
    """ftlayer.config.FTConfig replaced by a copy of its module's class with ``field``
    (source lines) added last."""
    source = Path(inspect.getfile(ftlayer.config)).read_text()
    at = source.index("\n    def __post_init__")
    path = tmp_path / "config_copy.py"
    path.write_text(source[:at] + "\n" + field + source[at:])
    spec = importlib.util.spec_from_file_location("config_copy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "config_copy", module)
    spec.loader.exec_module(module)
    copy: type = module.FTConfig
    monkeypatch.setattr(ftlayer.config, "FTConfig", copy)
    return copy


def test_a_new_field_makes_the_committed_page_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _config_copy(tmp_path, monkeypatch, '    dummy_s: float = 7.5\n    """A dummy, seconds."""\n')
    assert "| `dummy_s` | `float` | `7.5` | A dummy, seconds. |" in reference.render()
    assert reference.main(["--check"]) == 1
    assert reference.COMMAND in capsys.readouterr().err


def test_a_field_without_a_meaning_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _config_copy(tmp_path, monkeypatch, "    dummy_s: float = 7.5\n")
    with pytest.raises(reference.MissingMeaningError, match=r"FTConfig\.dummy_s"):
        reference.render()
    assert reference.main([]) == 1
    assert "FTConfig.dummy_s" in capsys.readouterr().err


def test_a_parameter_without_a_meaning_fails_naming_it() -> None:
    def stage(fn: object, limit: int = 3, quiet: bool = False) -> None:
        """Runs ``fn(record)`` once per record. ``limit``: the most calls; ``quiet``: log
        nothing."""

    rows = {r.name: r for r in reference.signature_rows(stage, [stage.__doc__], "stage")}
    assert rows["fn"].meaning == "Runs `fn(record)` once per record."
    assert (rows["limit"].default, rows["limit"].meaning) == ("3", "the most calls.")
    assert rows["quiet"].meaning == "log nothing."
    stage.__doc__ = """Runs ``fn(record)`` once per record. ``limit``: the most calls."""
    with pytest.raises(reference.MissingMeaningError, match=r"stage\(quiet\)"):
        reference.signature_rows(stage, [stage.__doc__], "stage")

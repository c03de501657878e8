"""benchmarks/results/RESULTS.md is what benchmarks.results_md generates from the JSON results
files next to it: every figure has one source, and every results file has a section."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import results_md

RESULTS = results_md.RESULTS_DIR
COMMITTED = RESULTS / results_md.OUTPUT_NAME
REGENERATE = f"benchmarks/results/RESULTS.md is out of date: run `{results_md.COMMAND}`"


def _copy_results(tmp_path: Path) -> Path:
    """The results files and the committed RESULTS.md, copied into a fresh directory."""
    out = tmp_path / "results"
    out.mkdir()
    for path in [*RESULTS.glob("*.json"), COMMITTED]:
        shutil.copy(path, out / path.name)
    return out


def test_committed_results_md_is_what_the_json_files_generate(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    assert results_md.main(["--output", str(out)]) == 0
    assert COMMITTED.exists(), REGENERATE
    assert out.read_text() == COMMITTED.read_text(), REGENERATE


def test_every_results_file_has_a_section() -> None:
    text = COMMITTED.read_text()
    names = sorted(p.name for p in RESULTS.glob("*.json"))
    assert names
    missing = [n for n in names if f"\n## {n}\n" not in text]
    assert not missing, f"no section for {missing}: run `{results_md.COMMAND}`"


def test_older_runs_are_labelled_and_kept_out_of_the_standing_goals() -> None:
    text = COMMITTED.read_text()
    standing = text.split("\n## Standing goals\n", 1)[1].split("\n## Files\n", 1)[0]
    for name in results_md.OLDER_RUNS:
        if (RESULTS / name).exists():
            assert f"](#{results_md.anchor(name)})" not in standing, name
            section = text.split(f"\n## {name}\n", 1)[1]
            assert section.lstrip().startswith("*Older run"), name


def test_check_fails_when_a_figure_changes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = _copy_results(tmp_path)
    assert results_md.main(["--results", str(results), "--check"]) == 0
    path = results / "pipeline_overhead.json"
    data = json.loads(path.read_text())
    data["ratio_ft_on_vs_arrow"] = 0.5
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    capsys.readouterr()
    assert results_md.main(["--results", str(results), "--check"]) == 1
    out = capsys.readouterr()
    assert "run `python -m benchmarks.results_md`" in out.err
    assert "-| [pipeline_overhead.json]" in out.out and "0.5 | ≥ 0.9 | **no**" in out.out
    assert results_md.main(["--results", str(results)]) == 0  # regenerated: the check passes
    assert results_md.main(["--results", str(results), "--check"]) == 0


def test_check_fails_when_results_md_is_edited_by_hand(tmp_path: Path) -> None:
    results = _copy_results(tmp_path)
    md = results / results_md.OUTPUT_NAME
    text = md.read_text()
    figure = re.search(r"\b0\.\d{3}\b", text)  # the first ratio it shows, whatever it is
    assert figure
    md.write_text(text.replace(figure.group(), f"{float(figure.group()) + 0.05:.3f}", 1))
    assert results_md.main(["--results", str(results), "--check"]) == 1
    md.unlink()
    assert results_md.main(["--results", str(results), "--check"]) == 1


def test_a_new_or_unreadable_results_file_still_gets_a_section(tmp_path: Path) -> None:
    results = _copy_results(tmp_path)
    (results / "brand_new.json").write_text(json.dumps({
        "date": "2030-01-01", "speed": 3.5, "nested": {"a": 1},
        "goals": {"speed": ">= 4", "other": {"target": "<= 2", "measured": 1, "met": True}},
    }))  # fmt: skip
    (results / "broken.json").write_text("{not json")
    (results / "pipeline_overhead_stream_1024.json").write_text(json.dumps({"records": 10}))
    (results / "ack_throughput_run7.json").write_text(json.dumps({"records": 10}))
    text = results_md.render(results)
    for name in ("brand_new.json", "broken.json", "pipeline_overhead_stream_1024.json",
                 "ack_throughput_run7.json"):  # fmt: skip
        assert f"\n## {name}\n" in text, name
    new = text.split("\n## brand_new.json\n", 1)[1].split("\n## ", 1)[0]
    assert "| `speed` | 3.5 |" in new and "| goal `speed` | 3.5 | ≥ 4 | **unmet** |" in new
    assert "*Older run (by its file name)" in text.split("\n## ack_throughput_run7.json\n")[1]
    assert results_md.render(results) == text  # deterministic

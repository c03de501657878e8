"""``benchmarks/results/RESULTS.md``: every benchmark figure in one page, generated from the
JSON results files, never edited by hand.

    python -m benchmarks.results_md            # (re)write benchmarks/results/RESULTS.md
    python -m benchmarks.results_md --check    # exit 1, with a diff, if it is out of date

What it guarantees:

* every ``*.json`` in ``benchmarks/results/`` gets a section (``## <file name>``): what the
  benchmark measures (the first paragraph of its module's docstring), the command that
  reproduces it (the JSON's ``command`` where recorded, else the module's usage), the
  machine / Redis facts the JSON records, and a table of its headline figures: the
  measured value beside its baseline measured in the same run, the ratio (as recorded;
  computed as measured / baseline only where the JSON records none), quartiles where
  present, the goal and whether it is met;
* files holding older runs kept for reference (``pipeline_overhead_2026-11-25_11_rounds.json``,
  ``cluster_e2e_run2.json``, or any name ending in a date or ``_runN``) get a section
  labelled as such, and their goals stay out of the summary of standing goals at the top;
* a file with no renderer of its own (a new benchmark), or one its renderer cannot read,
  still gets a section: its top-level scalar fields and any goals it records. Generation
  never fails on a results file;
* the output depends on nothing but the JSON files and the benchmark modules' docstrings
  (read with ``ast``, nothing imported): files in sorted order, figures printed as the
  JSON records them (computed ratios rounded to 3 decimals), so ``--check`` is stable.

After a benchmark writes or changes a results file, run ``python -m benchmarks.results_md``
and commit RESULTS.md with it: ``tests/test_results_md.py`` fails while RESULTS.md differs
from what these files generate.

The package: ``page`` (formatting, goals and the ``Page`` a section is built on),
``sections`` (which renderer a results file gets, with ``redis_sections``,
``rehearsal_sections`` and ``spark_sections`` holding the renderers), ``document`` (the
page assembled: the benchmark modules' docstrings, the sections, ``render``) and this
module's ``main``.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from benchmarks.results_md.document import (
    COMMAND,
    OLDER_RUNS,
    OUTPUT_NAME,
    RESULTS_DIR,
    anchor,
    render,
)

__all__ = ["COMMAND", "OLDER_RUNS", "OUTPUT_NAME", "RESULTS_DIR", "anchor", "main", "render"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS_DIR,
                    help="the directory of results files (default: %(default)s)")
    ap.add_argument("--output", type=Path, default=None,
                    help=f"where to write (default: <results>/{OUTPUT_NAME})")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the output file differs from what the "
                         "results generate")  # fmt: skip
    args = ap.parse_args(argv)
    output = args.output or args.results / OUTPUT_NAME
    text = render(args.results)
    if args.check:
        old = output.read_text() if output.exists() else ""
        if old == text:
            print(f"{output} is up to date")
            return 0
        diff = difflib.unified_diff(old.splitlines(), text.splitlines(), f"{output} (committed)",
                                    f"{output} (generated)", lineterm="", n=1)  # fmt: skip
        print("\n".join(list(diff)[:200]))
        print(f"\n{output} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    output.write_text(text)
    print(f"wrote {output}")
    return 0

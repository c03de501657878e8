"""``python -m benchmarks.results_md [--check]``: see the package's docstring."""

from benchmarks.results_md import main

raise SystemExit(main())

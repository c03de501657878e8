"""What a PromQL expression reads, for the tests that check dashboards and alert rules
against the metrics a sidecar exports."""

from __future__ import annotations

import re

from ftlayer.service.metrics import METRIC_TYPES


def metric_names(expr: str) -> set[str]:
    """The metric families an expression reads (a histogram's ``_bucket``, ``_sum`` and
    ``_count`` series by their family's name; counters by their ``_total`` name)."""
    names = set()
    for name in re.findall(r"\bftlayer_[a-z0-9_]+", expr):
        family, _, suffix = name.rpartition("_")
        if METRIC_TYPES.get(family) == "histogram" and suffix in ("bucket", "sum", "count"):
            name = family
        names.add(name)
    return names

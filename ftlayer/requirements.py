"""What ftlayer needs of the user's own PySpark. PySpark is not a hard dependency: the
platform's PySpark (Databricks, EMR, Dataproc images) must not be shadowed by a wheel,
so ``pip install ftlayer`` leaves it alone and ``pip install 'ftlayer[spark]'`` brings one.
Everything Spark-side (``ftlayer.spark``, ``ftlayer demo``) checks it first, with one line
saying what is missing and how to get it."""

from __future__ import annotations

from ftlayer.errors import ConfigError

__all__ = ["PYSPARK_SUPPORTED", "require_pyspark", "supported"]

PYSPARK_SUPPORTED = ((4, 0), (5, 0))
"""PySpark versions ftlayer runs on: from the first up to (not including) the second."""


def supported(version: str) -> bool:
    """True when PySpark ``version`` (e.g. ``4.0.1``, ``4.1.0.dev2``) is in the range."""
    parts = []
    for p in version.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    low, high = PYSPARK_SUPPORTED
    return low <= tuple(parts) < high


def require_pyspark() -> str:
    """PySpark's version; ConfigError when it is missing or outside PYSPARK_SUPPORTED."""
    want = f"PySpark {PYSPARK_SUPPORTED[0][0]}.x"
    try:
        import pyspark
    except ImportError:
        raise ConfigError(
            f"ftlayer's Spark side needs {want}, which is not installed here: pip install "
            "'ftlayer[spark]', or run where your platform's PySpark is") from None
    version = str(getattr(pyspark, "__version__", "0"))
    if not supported(version):
        raise ConfigError(
            f"ftlayer's Spark side needs {want}, this is PySpark {version} "
            f"({pyspark.__file__}): pip install 'ftlayer[spark]' in a fresh environment")
    return version

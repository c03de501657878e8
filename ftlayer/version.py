"""The one version source: setup.cfg reads it, ``ftlayer --version`` prints it, the Redis
function library's name carries it. Changed with each release (CHANGELOG.md)."""

__version__ = "0.2.0"

"""A quick start for the replay stream's reader: its process imports PySpark's compiled code.

Spark runs a Python streaming source's reader (its offsets, its commits) in a Python
process of its own, started on the driver for every run of a query
(``PythonStreamingSourceRunner``, through ``PythonWorkerFactory.createSimpleWorker``), with
Spark's ``python/lib/pyspark.zip`` first on that process's ``PYTHONPATH``. Python compiles
a module imported from a zip each time: starting the reader costs a query about a second,
where the same imports from the installed package, whose bytecode is cached, take a
third of that.

When PySpark is a pip install, ``SPARK_HOME`` is the installed ``pyspark`` package and
the zip inside it holds the same files. Then ftlayer registers its replay source with a
launcher as the source's Python: a shell script that puts a private directory first on
``PYTHONPATH``, holding links to that same ``pyspark`` package (and to ``py4j`` when its
version is the zip's), and runs the Python Spark would have run (``spark.pyspark.python``
or ``PYSPARK_PYTHON``, as the context resolved it). It also takes off that
``PYTHONPATH`` the archives Spark puts there that hold nothing the directory does not
(:func:`shadowed`: PySpark's zip, py4j's, the 16 MB jar of Spark's core, which holds no
Python): left there, each had its directory read at the first import that missed the
directory, again at every ``importlib.invalidate_caches`` and at redis-py's
``importlib.metadata`` lookup -- about 0.3 s of each query's start on the machines
measured.

Invariants:

* The same interpreter and the same PySpark files run: only where they are imported from
  changes; every ``PYTHONPATH`` entry but those archives is kept, in its order. When
  anything is unclear (Spark Connect, a Spark distribution whose ``python/`` is not the
  installed package, a platform without ``/bin/sh``) the source is registered the way
  ``spark.dataSource.register`` does it.
* Only for sources whose tasks read nothing (``partitions()`` returns none): Spark also
  runs a source's read tasks with its Python, on executors, where the launcher, a file on
  the driver, does not exist.
* The launcher's directory is made once per driver process (``tempfile.mkdtemp``: private
  to its user) and removed when the process exits; the launcher is run once before it is
  used (a temporary directory mounted ``noexec`` leaves the source registered as Spark
  does).
* A driver holds an exclusive ``flock`` on its directory's ``owner.lock`` while it lives
  (the kernel lets go of it when the process ends, ``kill -9`` included, in any PID
  namespace); a lock file appears only locked (made under another name, then renamed).
  Making its own directory, a driver removes those of its user whose lock it can take:
  their driver died without its ``atexit``. A directory without the file (an older
  version's) is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftlayer.spark import fork_client
from ftlayer.spark.forkserver import Forkserver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["keep_warm", "launcher", "own", "register_source", "shadowed", "sweep"]

log = logging.getLogger(__name__)

_made: dict[tuple[str, str], str | None] = {}
_servers: list[Forkserver] = []
_owned: list[int] = []
"""The open descriptors of this process's ``owner.lock`` files: closing one lets go."""

PREFIX = "ftlayer-source-"
OWNER = "owner.lock"

_UDS = "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"


def register_source(spark: SparkSession, source: type, quick_start: bool) -> None:
    """Register the Python data source class ``source`` with ``spark`` under its
    ``name()``; ``quick_start`` (its tasks read nothing): through the launcher, when one
    applies."""
    python = launcher(spark) if quick_start else None
    if python is None:
        spark.dataSource.register(source)
        return
    from pyspark.core.rdd import _prepare_for_python_RDD

    sc = spark.sparkContext
    command, broadcasts, env, includes = _prepare_for_python_RDD(sc, source)
    jvm: Any = sc._jvm
    function = jvm.SimplePythonFunction(bytearray(command), env, includes, python,
                                        sc.pythonVer, broadcasts, sc._javaAccumulator)  # fmt: skip
    spark._jsparkSession.dataSource().registerPython(
        source.name(), getattr(jvm, _UDS)(function))  # type: ignore[attr-defined]


def launcher(spark: SparkSession) -> str | None:
    """The launcher's path for ``spark``'s driver, or None where it does not apply."""
    if os.name != "posix" or not Path("/bin/sh").exists():
        return None
    if getattr(spark, "_jsparkSession", None) is None:  # Spark Connect: no JVM here
        return None
    sc = spark.sparkContext
    home = sc._jvm.java.lang.System.getenv("SPARK_HOME")  # type: ignore[union-attr]
    package = _pip_package(home)
    if package is None:
        return None
    key = (str(package), sc.pythonExec)
    if key not in _made:
        _made[key] = _checked(_make(package, sc.pythonExec))
    return _made[key]


def _checked(script: str) -> str | None:
    """``script`` if it runs (a temporary directory mounted ``noexec``, or a Python that
    is not there, would stop every query's start); None, logged, if not."""
    try:
        subprocess.run([script, "-c", ""], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("the replay source's reader starts the slow way: its launcher %s "
                    "does not run (%s)", script, e)  # fmt: skip
        return None
    return script


def _pip_package(home: str | None) -> Path | None:
    """``home`` when it is an installed ``pyspark`` package holding Spark's zip."""
    if not home:
        return None
    package = Path(home)
    zipped = package / "python" / "lib" / "pyspark.zip"
    if package.name != "pyspark" or not (package / "__init__.py").is_file():
        return None
    return package if zipped.is_file() else None


def _py4j(package: Path) -> Path | None:
    """The installed ``py4j`` beside ``package`` when its version is that of Spark's
    ``py4j-<version>-src.zip``."""
    zips = list((package / "python" / "lib").glob("py4j-*-src.zip"))
    installed = package.parent / "py4j"
    if len(zips) != 1 or not (installed / "version.py").is_file():
        return None
    wanted = zips[0].name[len("py4j-"):-len("-src.zip")]
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (installed / "version.py").read_text())
    return installed if found and found.group(1) == wanted else None


def keep_warm() -> None:
    """Start again any warm server (ftlayer.spark.forkserver) of this driver that died;
    called as a query's replay stream is made (meanwhile its reader starts plainly)."""
    for server in _servers:
        server.running()


def _make(package: Path, python: str) -> str:
    """A private directory with the links and the launcher script; its script's path.
    On Linux the script hands the start to a warm server (ftlayer.spark.forkserver),
    started here, through its client."""
    sweep(Path(tempfile.gettempdir()))
    home = Path(tempfile.mkdtemp(prefix=PREFIX))
    atexit.register(shutil.rmtree, home, True)
    own(home)
    os.symlink(package, home / "pyspark")
    py4j = _py4j(package)
    if py4j is not None:
        os.symlink(py4j, home / "py4j")
    run = f'exec {shlex.quote(python)} "$@"\n'
    if sys.platform.startswith("linux") and hasattr(socket, "send_fds"):
        server = Forkserver(home, python, os.pathsep.join(
            [str(home), *filter(None, [os.environ.get("PYTHONPATH")])]))  # fmt: skip
        try:
            server.running()
        except OSError as e:  # a socket path too long for AF_UNIX (a deep TMPDIR), say
            log.warning("the replay source's reader starts without a warm process: %s", e)
        else:
            _servers.append(server)
            atexit.register(server.stop)
            client = shlex.quote(str(Path(fork_client.__file__).resolve()))
            run = (f"exec {shlex.quote(python)} -S {client} "
                   f'{shlex.quote(str(server.socket))} {shlex.quote(python)} "$@"\n')  # fmt: skip
    script = home / "python"
    script.write_text(
        "#!/bin/sh\n"
        "# ftlayer: Spark's Python, importing PySpark from its installed package\n"
        + _path_lines(home, shadowed(package, linked_py4j=py4j is not None)) + run
    )
    script.chmod(0o700)
    return str(script)


def shadowed(package: Path, linked_py4j: bool) -> list[Path]:
    """The archives Spark puts on its Python processes' ``PYTHONPATH``
    (``PythonUtils.sparkPythonPath``: ``pyspark.zip``, ``py4j-*-src.zip`` and the jar of
    Spark's core) that hold nothing the launcher's directory does not give already: the
    zip of ``package`` (linked), py4j's zip when py4j is linked, a jar with no Python
    file in it. Each one left on the path costs a start its directory read from disk,
    again at every ``importlib.invalidate_caches`` (Spark's workers call it), and a scan
    at every ``importlib.metadata`` lookup (redis-py makes one per connection): about
    0.3 s of the reader's start, most of it the 16 MB jar."""
    import zipfile

    lib = package / "python" / "lib"
    out = [lib / "pyspark.zip", *(sorted(lib.glob("py4j-*-src.zip")) if linked_py4j else [])]
    for jar in sorted((package / "jars").glob("spark-core_*.jar")):
        try:
            with zipfile.ZipFile(jar) as z:
                if not any(n.endswith((".py", ".pyc")) for n in z.namelist()):
                    out.append(jar)
        except (OSError, zipfile.BadZipFile):
            continue
    return out


def _path_lines(home: Path, drop: list[Path]) -> str:
    """The launcher's lines that put ``home`` first on ``PYTHONPATH`` and take the
    archives ``drop`` off it (every other entry kept, in its order, empty ones too)."""
    quoted = " ".join(shlex.quote(str(p)) for p in drop)
    return (f'rest=":${{PYTHONPATH-}}:"\n'
            f"for drop in {quoted}; do\n"
            '  case $rest in *":$drop:"*) rest="${rest%%":$drop:"*}:${rest#*":$drop:"}" ;; esac\n'
            "done\n"
            'rest=${rest#:}; rest=${rest%:}\n'
            f'PYTHONPATH={shlex.quote(str(home))}"${{rest:+:$rest}}"\n'
            "export PYTHONPATH\n")  # fmt: skip


def own(home: Path) -> None:
    """Hold ``home/owner.lock`` locked for the rest of this process (see the invariants)."""
    try:
        import fcntl
    except ImportError:  # no flock here: the directory is left as it was
        return
    part = home / f".{OWNER}.{os.getpid()}"
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(part, home / OWNER)
    _owned.append(fd)


def sweep(tmp: Path) -> list[Path]:
    """Remove the launcher directories under ``tmp`` of this user whose driver died
    (their ``owner.lock`` can be locked); the ones removed."""
    try:
        import fcntl
    except ImportError:
        return []
    gone = []
    for home in tmp.glob(PREFIX + "*"):
        try:
            if home.is_symlink() or home.stat().st_uid != os.getuid():
                continue
            fd = os.open(home / OWNER, os.O_RDWR)
        except OSError:  # not ours, no lock file (an older version's), gone meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its driver lives
            os.close(fd)
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(home)
            gone.append(home)
        os.close(fd)
    if gone:
        log.info("removed %d launcher directories of drivers that died", len(gone))
    return gone

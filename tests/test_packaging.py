"""The package as a user installs it: a wheel built from this tree, installed (not ``-e``)
into a virtual environment of its own, with PySpark as the user's own -- missing first
(a clear error), then present (``ftlayer demo`` runs from the wheel)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from ftlayer import __version__
from ftlayer.requirements import supported

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
_NOT_SOURCE = (".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
               ".hypothesis", "spark-warehouse")  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of this tree (the build writes into its source)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(base), str(src)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    (found,) = base.glob("ftlayer-*.whl")
    return found


def test_the_wheel_holds_what_ftlayer_needs(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith(f"ftlayer-{__version__}-")
    for must in ("ftlayer/lua/core/buckets.lua", "ftlayer/lua/claim.lua", "ftlayer/py.typed",
                 "partitioners/__init__.py", "serialization/__init__.py"):  # fmt: skip
        assert must in names, must
    assert any(n.endswith("LICENSE") and ".dist-info/" in n for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(meta_name).decode())
    assert meta["Version"] == __version__ and meta["License"] == "Apache-2.0"
    spark = [r for r in meta.get_all("Requires-Dist") if r.startswith("pyspark")]
    assert spark and all('extra == "' in r for r in spark), spark  # never a hard requirement


def _site(env: Path) -> Path:
    return next((env / "lib").glob("python3*/site-packages"))


def _shared(into: Path, keep: callable) -> None:  # type: ignore[valid-type]
    """Links to this environment's installed packages that ``keep`` accepts: the wheel's
    dependencies as pip would have installed them, without the network."""
    here = Path(next(p for p in sys.path if p.endswith("site-packages")))
    into.mkdir()
    for entry in here.iterdir():
        if keep(entry.name.lower()):
            (into / entry.name).symlink_to(entry)


@pytest.mark.spark
def test_the_wheel_installs_and_runs_the_demo_with_the_users_own_pyspark(
    wheel: Path, tmp_path: Path
) -> None:
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    python, ftlayer = str(env / "bin" / "python"), str(env / "bin" / "ftlayer")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    ours = ("ftlayer", "__editable__", "pyspark", "py4j", "_pytest", "pytest")
    _shared(tmp_path / "deps", lambda n: not n.startswith(ours))
    (_site(env) / "deps.pth").write_text(str(tmp_path / "deps") + "\n")
    work = tmp_path / "cwd"  # not the repository: its ftlayer/ must not be the one imported
    work.mkdir()
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, cwd=work,
                              env=run_env, timeout=timeout)  # fmt: skip

    out = run(ftlayer, "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"ftlayer {__version__}", out
    where = run(python, "-c", "import ftlayer; print(ftlayer.__file__)").stdout
    assert where.startswith(str(env)), where

    # no PySpark: one line naming the extra, exit 1
    out = run(ftlayer, "demo", "--records", "200")
    assert out.returncode == 1, out
    assert "needs PySpark 4.x" in out.stderr and "ftlayer[spark]" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr

    # the user's own PySpark (a platform's, on the path): the demo runs from the wheel
    _shared(tmp_path / "spark", lambda n: n.startswith(("pyspark", "py4j")))
    (_site(env) / "spark.pth").write_text(str(tmp_path / "spark") + "\n")
    out = run(ftlayer, "demo", "--records", "2000", "--batches", "2", "--json", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"lost": 0' in out.stdout, out.stdout[-2000:]


def test_supported_pyspark_versions() -> None:
    assert supported("4.0.0") and supported("4.3.0") and supported("4.1.0.dev2")
    assert not supported("3.5.1") and not supported("5.0.0") and not supported("2.4")

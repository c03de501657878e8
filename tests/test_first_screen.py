"""The README's first screen: two commands, each run as written where a new user runs them.

The second (the tests) is what CI runs (``.ci/run`` takes it from the README). The first
(the main job) runs here in a fresh clone with the system's Python first on ``PATH`` -- a
stock Debian Python, whose ``pip`` refuses to install outside a virtual environment
(PEP 668, ``externally-managed-environment``)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def first_screen() -> list[str]:
    """The commands of the README's first code block (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "no bash block in the README"
    return [line.split("   #")[0].strip() for line in block.group(1).splitlines() if line]


def test_the_first_screen_is_two_commands_each_in_a_venv() -> None:
    """Catches: a third command, the main job or the tests missing, a command that
    installs into whatever Python comes first (a system's refuses), and CI running
    another test command than the README's."""
    demo, tests = first_screen()
    for line in (demo, tests):
        assert line.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install ")
    assert demo.endswith("&& ftlayer demo") and tests.endswith("&& pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    found = re.search(r'grep -m1 -o "(.*?)" README.md', ci)
    assert found and re.search(found.group(1), tests) and not re.search(found.group(1), demo)
    assert "\n```\n\n```\n" not in (ROOT / "README.md").read_text(), "an empty code block"


@pytest.mark.slow
def test_the_main_job_runs_as_written_in_a_fresh_clone_on_the_system_python(
    tmp_path: Path,
) -> None:
    """Catches (seen failing with the README's old first line, `pip install '.[spark]' &&
    ftlayer demo`: `error: externally-managed-environment`): a first command that needs a
    Python the user does not have, or files a fresh clone lacks."""
    assert SYSTEM_PYTHON.exists(), "the machine's own python3 (Debian's) is what this runs"
    clone = tmp_path / "clone"  # what is committed, as a user gets it
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                        "SPARK_HOME", "PYTHONHOME")}  # fmt: skip
    env["PATH"] = "/usr/bin:/bin"  # the system's python3 and pip first (Java is there too)
    demo, _ = first_screen()
    out = subprocess.run(["bash", "-c", demo], cwd=clone, env=env, capture_output=True,
                         text=True, timeout=1500)  # fmt: skip
    said = out.stdout + out.stderr
    assert "externally-managed-environment" not in said
    assert out.returncode == 0, said[-4000:]
    assert re.search(r"^OK: [\d,]+ records, 0 lost", out.stdout, re.M), out.stdout[-3000:]

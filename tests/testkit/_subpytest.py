"""Run a test module in a pytest of its own (a subprocess), with only the plugins given: the
async plugins do not clash, and a hang is a failure with its output, not a stuck suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: pytest-asyncio with a new loop per test (its default), anyio's plugin off.
ASYNCIO = ["-p", "no:anyio", "-o", "asyncio_mode=auto"]
ASYNCIO += ["-o", "asyncio_default_fixture_loop_scope=function"]
#: anyio's plugin (its asyncio backend), pytest-asyncio off. Tests carry ``pytest.mark.anyio``.
ANYIO = ["-p", "no:asyncio"]


def run_pytest(
    where: Path, files: dict[str, str], args: list[str], ini: str = ""
) -> subprocess.CompletedProcess[str]:
    """Write ``files`` (name -> text) and a ``pytest.ini`` (``[pytest]`` + ``ini``) into
    ``where`` and run pytest there, stopping at the first failure (each test within 20 s)."""
    (where / "pytest.ini").write_text("[pytest]\n" + ini)
    for name, text in files.items():
        (where / name).write_text(text)
    path = os.pathsep.join(p for p in (str(where), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist"]
    cmd += ["--timeout", "20", "-c", str(where / "pytest.ini"), "--rootdir", str(where), *args]
    return subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=150)

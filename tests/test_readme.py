"""The README's code runs: its Python sample on the in-process broker, and its commands parse."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests._cli_runs import run_aqw

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


async def test_the_python_sample_runs_on_the_memory_broker() -> None:
    (sample,) = _blocks("python")
    code = sample.replace('"redis://127.0.0.1:6379/0"', '"memory://readme"')
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    await namespace["produce"]()
    await namespace["embed"]()
    app = namespace["app"]
    assert (await app.broker.depth()).delayed == 1  # produce() enqueued with delay=5.0
    assert set(app.tasks) == {"import_file"}


def test_every_aqw_command_in_the_readme_is_accepted() -> None:
    lines = [
        line.split("#")[0].split()
        for block in _blocks("bash")
        for line in block.splitlines()
        if line.startswith("aqw ")
    ]
    assert lines, "the README shows aqw commands"
    for words in lines:
        command = words[1] if words[1] not in ("dlq", "job") else f"{words[1]} {words[2]}"
        result = run_aqw([*command.split(), "--help"], timeout=60)
        assert result.returncode == 0, result.stderr
        for option in (w for w in words if w.startswith("--")):
            assert option in result.stdout, f"`aqw {command}` has no {option}"

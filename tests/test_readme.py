"""The README's Python examples run, in order, as a newcomer would paste them."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_two_commands_first() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    assert first_block is not None
    commands = [line for line in first_block.group(1).splitlines() if line and not line.startswith("#")]
    assert commands[0].endswith("rollq demo")
    assert commands[1].endswith("python -m pytest")


def test_readme_test_command_is_what_ci_runs() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    assert first_block is not None
    test_command = [line for line in first_block.group(1).splitlines() if line and not line.startswith("#")][1]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert test_command in ci


def test_readme_python_examples_run(capsys) -> None:  # type: ignore[no-untyped-def]
    blocks = python_blocks()
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "succeeded" in printed and "1.0" in printed

"""The code blocks of the README and of docs/*.md, read the way the tests that run them need them.

Tests run these blocks as a reader would paste them, so a page that drifts from the code fails a test. A block
is found by its fence language and, where a page holds blocks that are sketches rather than programs, by the
section (a Markdown heading) it sits under.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def section(path: Path, heading: str) -> str:
    """The text under the first heading that starts with ``heading`` (``## Name``), up to the next heading of
    the same or a higher level; a ``#`` line inside a fenced block (a shell comment) is not a heading."""
    level = len(heading) - len(heading.lstrip("#"))
    found: list[str] | None = None
    fenced = False
    for line in path.read_text().splitlines(keepends=True):
        is_heading = not fenced and re.match(r"#+ ", line) is not None
        if line.startswith("```"):
            fenced = not fenced
        if found is None:
            if is_heading and line.startswith(heading):
                found = []
        elif is_heading and len(line) - len(line.lstrip("#")) <= level:
            break
        else:
            found.append(line)
    assert found is not None, f"{path.name} has no section {heading!r}"
    return "".join(found)


def code_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language`` in ``text``, in order."""
    return re.findall(rf"^```{re.escape(language)}\n(.*?)^```", text, flags=re.S | re.M)

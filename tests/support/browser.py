"""Debian's Chromium, headless: a page's DOM after its scripts ran, or a screenshot; rows the scripts rendered."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

from tests.support.binaries import require


def require_chromium() -> str:
    """Debian's chromium (see :func:`tests.support.binaries.require`)."""
    return require("chromium", "apt-get install chromium")


def chromium(binary: str, profile: Path, url: str, *, screenshot: Path | None = None, virtual_ms: int = 5000) -> str:
    """Load ``url`` headless, let its scripts run their first polls, and return the DOM (or write a screenshot)."""
    profile.mkdir(parents=True, exist_ok=True)
    # rq-dashboard fills its tables from JSON endpoints in page scripts; the
    # virtual time budget lets those requests and renders finish first.
    args = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={virtual_ms}",
    ]
    args += [f"--screenshot={screenshot}", "--window-size=1280,900"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"chromium failed on {url}: {done.stderr[-2000:]}"
    return done.stdout


class RenderedRows(HTMLParser):
    """The cells of every ``<tr data-role=ROLE>`` the page's scripts rendered.

    Row templates sit inside ``<script type="text/template">``, whose content
    the parser keeps as text, so only rows that were really rendered count.
    """

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role
        self.rows: list[list[str]] = []
        self._depth = 0  # <tr> nesting inside a matching row; 0 = outside one
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr" and (self._depth or ("data-role", self.role) in attrs):
            if not self._depth:
                self.rows.append([])
            self._depth += 1
        elif tag == "td" and self._depth:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._depth:
            self._depth -= 1
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def rendered_rows(dom: str, role: str) -> list[list[str]]:
    parser = RenderedRows(role)
    parser.feed(dom)
    return parser.rows

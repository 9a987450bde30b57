"""Helpers the report modules share: reading a results file, Markdown tables, numbers, verdicts."""

from __future__ import annotations

import json
from typing import Any

from bench.common import RESULTS


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"

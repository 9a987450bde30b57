"""The layers import downwards only: models <- store <- {producer, worker} <- train <- {ops, compat}.

Read from the source (imports under ``TYPE_CHECKING`` included), so an arrow running back up fails here even
where it would not fail at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "rollq"
# What each layer may import from rollq besides itself.
ALLOWED: dict[str, set[str]] = {
    "models": set(),
    "store": {"models"},
    "producer": {"models", "store"},
    "worker": {"models", "store"},
    "train": {"models", "store", "producer"},
    "ops": {"models", "store", "producer", "worker", "compat", "train"},
    "compat": {"models", "store", "producer", "worker"},
}


def _layers() -> list[str]:
    return [layer for layer in ALLOWED if (ROOT / layer / "__init__.py").exists()]


def _rollq_imports(path: Path, layer: str) -> set[str]:
    """The rollq layers ``path`` imports; a relative import that climbs out of its package counts as ``..``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names = [node.module]
            elif node.level >= 2 and len(path.relative_to(ROOT).parent.parts) < node.level:
                found.add("..")  # across layers, imports name rollq.<layer> so that this test can read them
        for name in names:
            parts = name.split(".")
            if parts[0] == "rollq" and len(parts) > 1 and parts[1] in ALLOWED and parts[1] != layer:
                found.add(parts[1])
            if parts[0] in ALLOWED and parts[0] != "rollq":
                found.add(f"top-level {parts[0]}")
    return found


@pytest.mark.parametrize("layer", _layers())
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported - ALLOWED[layer])
        for path in sorted((ROOT / layer).rglob("*.py"))
        if (imported := _rollq_imports(path, layer)) - ALLOWED[layer]
    }
    assert not wrong


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    module = ROOT / "models" / "contract.py"
    source = tmp_path / "m.py"
    source.write_text(module.read_text() + "\nfrom rollq.worker.runner import AgentRunner\n")
    assert "worker" in _rollq_imports(source, "models")

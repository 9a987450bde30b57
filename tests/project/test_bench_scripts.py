"""Every benchmark a reader may run answers ``--help`` with its usage, and does nothing else.

``bench/al_side.py`` is left out: it runs inside an Agent Lightning venv (``bench/al.py`` starts it there).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IN_ANOTHER_VENV = {"al_side.py"}
SCRIPTS = sorted(
    p.name
    for p in (ROOT / "bench").glob("*.py")
    if 'if __name__ == "__main__":' in p.read_text() and p.name not in IN_ANOTHER_VENV
)


def test_the_bench_folder_has_scripts_to_check():
    assert len(SCRIPTS) > 20


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_answers_help_with_its_usage_and_writes_nothing(script):
    watched = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "bench" / "results").glob("*.json"))]
    before = [p.stat().st_mtime_ns for p in watched]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
    assert [p.stat().st_mtime_ns for p in watched] == before


RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_a_results_file_names_the_script_that_reproduces_it(path):
    # A run written under another name (--out) once recorded "python bench/<that name>.py", a script that does
    # not exist; docs/benchmarks.md quotes the command and picks the section's text by the script it names.
    command = json.loads(path.read_text())["command"].split()
    assert command[0] == "python"
    if command[1] == "-m":
        module = ROOT / Path(*command[2].split("."))
        assert (module / "__main__.py").is_file() or module.with_suffix(".py").is_file(), f"{path.name}: {command[2]}"
    else:
        assert (ROOT / command[1]).is_file(), f"{path.name}: {command[1]} is not a script"


DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])


def test_every_results_file_a_document_names_is_in_the_repository():
    # docs/scaling.md and reliability.md once quoted bench/results/failover.json for 20 runs after bench/run_all.py
    # had rewritten it with one: a run kept for the docs goes under a name of its own, and the name must resolve.
    named = {
        (doc.relative_to(ROOT), name)
        for doc in DOCS
        for name in re.findall(r"bench/results/([\w.-]+\.json)", doc.read_text())
    }
    assert named, "no document names a results file: the pattern no longer matches how the docs cite them"
    missing = sorted(f"{doc}: {name}" for doc, name in named if not (ROOT / "bench" / "results" / name).is_file())
    assert not missing, missing


def test_run_all_lists_the_docs_that_quote_a_results_file_it_rewrote(tmp_path, monkeypatch):
    # bench/run_all.py rewrites every results file, and docs other than the generated page quote some by hand: it
    # names those docs at the end of a run, found by the file's name, the --out that writes it, or its script.
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.run_all import quoted_by_hand

    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("Start here.\n")
    (tmp_path / "docs" / "benchmarks.md").write_text("bench/results/noop.json, generated\n")
    (tmp_path / "docs" / "a.md").write_text("quotes `bench/results/noop.json` and `python bench/al.py`\n")
    (tmp_path / "docs" / "b.md").write_text("`python bench/al.py --tasks-per-job 16 --out al_packs`; al_packsx.json\n")
    found = quoted_by_hand(["noop", "al", "al_packs", "idle"], tmp_path)
    assert found == {"docs/a.md": ["noop", "al"], "docs/b.md": ["al", "al_packs"]}

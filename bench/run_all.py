"""Run every benchmark, then regenerate docs/benchmarks.md (mock_llm.py and scaling.py draw the two plots).

Run: nice -n 10 python bench/run_all.py [--skip-profile] [--skip-cluster]   (about 35 minutes on 2 cores)
Needs the bench extra: pip install -e '.[dev,bench]' (matplotlib for the plots, psutil), and py-spy for the profile.

Each benchmark runs with the short settings below (each setting well under a minute), so that the whole
suite fits in a sitting on a shared 2-core machine; run a script on its own for longer windows.
bench/cluster/ (python -m bench.cluster) needs root and is skipped without it.

Each benchmark runs in a subprocess of its own, one after the other, and writes
bench/results/<name>.json (with the commit, the load before and after, the settings); ``bench/report.py``
then builds the page from those files, one section per file. The profile (bench/before_after.py runs it
for this tree and for rollq 0.2.0 as it landed) needs py-spy (pip install py-spy) and is skipped without it.

The run rewrites the results files that docs other than the generated page (docs/scaling.md, docs/workers.md, ...)
quote by hand; it ends by naming those docs and the files each quotes, for a person to check the figures. A run kept
for the docs is best written under a name of its own (each script's ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# (script, arguments): short windows, so that each setting stays well under a minute.
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("noop", ["--rounds", "2", "--jobs", "1000"]),
    ("mock_llm", ["--window", "10"]),
    ("al", ["--window", "8", "--rounds", "2"]),
    # The same with packs of 16 tasks per RQ job (opt-in; docs/rq.md, "Packs"): its own results file.
    ("al", ["--window", "8", "--rounds", "2", "--tasks-per-job", "16", "--out", "al_packs"]),
    # The feeder at most 512 tasks ahead of the trainer, as a trainer queueing work as it reads it (unbounded, the
    # workers publish twice what the trainer reads on 2 cores and take the CPU it needs; bench/big.py, --ahead).
    ("big", ["--window", "10", "--ahead", "512"]),
    # What the mock agent costs a process with no rollq at all, beside rollq's workers (the worker-CPU target's floor).
    ("worker_floor", ["--seconds", "12", "--rounds", "2", "--with-rollq"]),
    # Every trace published (the default) beside ROLLQ_ROLLOUT_TRACE=failed: bytes, Redis memory and CPU per rollout.
    ("rollout_trace", ["--window", "10", "--rounds", "2"]),
    ("inflight10k", []),
    ("scaling", ["--window", "8"]),
    ("failover", []),
    ("idle", ["--seconds", "20"]),
    ("enqueue", ["--tasks", "50000", "--rounds", "2"]),
    ("memory", ["--rollouts", "30000", "--max-seconds", "90"]),
    # Beside a thread running Python half the time in the proxy's process, as a worker's agents do (issue 24's
    # condition: the proxy's added latency while the workers themselves load the machine).
    ("capture", ["--agent-load", "0.5"]),
    # The proxy's CPU per call at call rates from ~100/s to as many as the cores carry, beside a raw forwarder: the
    # proxy-CPU target's rate and the machine's part of the figure.
    ("call_rate", []),
    ("startup", ["--rounds", "5"]),
    ("fleet_startup", ["--processes", "64", "--rounds", "2"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-profile", action="store_true", help="do not run bench/profile.py (py-spy)")
    parser.add_argument("--skip-cluster", action="store_true", help="do not run python -m bench.cluster (needs root)")
    args = parser.parse_args()
    missing = [m for m in ("matplotlib", "psutil") if importlib.util.find_spec(m) is None]
    if missing:
        # Found out before 20 minutes of benchmarks, not at the first plot.
        sys.exit(f"missing {', '.join(missing)}: pip install -e '.[dev,bench]'")
    names = list(BENCHMARKS)
    if not args.skip_cluster:
        if os.geteuid() == 0:
            names.append(("cluster", ["--rounds", "2"]))
        else:
            print("not root: skipping python -m bench.cluster (network namespaces need root)")
    has_py_spy = shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()
    if not args.skip_profile:
        if has_py_spy:
            # The profile of this tree, beside the same profile of rollq 0.2.0 as it landed (and both trees'
            # round trips per rollout); it also writes bench/results/profile.json.
            names.append(("before_after", ["--seconds", "10", "--rounds", "2"]))
        else:
            print("py-spy is not installed (pip install py-spy): skipping bench/profile.py")
    started = time.monotonic()
    before = _results_written()
    for name, extra in names:
        # A benchmark is a script, or a package run with -m (bench/cluster/).
        program = [str(BENCH / f"{name}.py")] if (BENCH / f"{name}.py").exists() else ["-m", f"bench.{name}"]
        print(f"=== {' '.join(program + extra)}", flush=True)
        t = time.monotonic()
        subprocess.run([sys.executable, *program, *extra], check=True, cwd=BENCH.parent)
        print(f"=== {' '.join(program)} took {time.monotonic() - t:.0f} s", flush=True)
    subprocess.run([sys.executable, str(BENCH / "report.py")], check=True)
    print(f"all benchmarks in {(time.monotonic() - started) / 60:.1f} min")
    rewritten = sorted(name for name, written in _results_written().items() if before.get(name) != written)
    for doc, names_quoted in quoted_by_hand(rewritten).items():
        print(f"{doc} quotes figures of rewritten results by hand, check them: {', '.join(names_quoted)}")


RESULTS = BENCH / "results"
GENERATED = {"benchmarks.md"}
"""Docs that bench/report.py writes from the results: every other doc that names a results file quotes it by hand."""


def _results_written() -> dict[str, int]:
    """Each results file's name (without .json) and when it was last written."""
    return {path.stem: path.stat().st_mtime_ns for path in RESULTS.glob("*.json")}


def _naming(name: str) -> str:
    """A pattern for the ways a doc names the results file ``name``: ``name.json``, the ``--out``/``--output`` that
    writes it, or the script ``bench/name.py``, whose default results name it is."""
    escaped = re.escape(name)
    return rf"(?<![\w-]){escaped}\.json|--out(?:put)?[ =]{escaped}(?![\w-])|bench/{escaped}\.py"


def quoted_by_hand(names: list[str], root: Path = BENCH.parent) -> dict[str, list[str]]:
    """The docs (README.md, docs/*.md but the generated page) that name any of the results files ``names`` (as
    :func:`_naming` finds them), with the names each one names: a run that rewrote those files left these docs'
    figures for a person to check."""
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    found: dict[str, list[str]] = {}
    for doc in docs:
        if doc.name in GENERATED:
            continue
        text = doc.read_text()
        named = [name for name in names if re.search(_naming(name), text)]
        if named:
            found[str(doc.relative_to(root))] = named
    return found


if __name__ == "__main__":
    main()

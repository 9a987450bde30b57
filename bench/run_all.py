"""Run every benchmark, then regenerate docs/benchmarks.md and docs/throughput.png from their results.

Run: python bench/run_all.py [--skip-profile]   (about 10 minutes on 2 cores)

Each benchmark runs in a subprocess of its own, one after the other, and writes
bench/results/<name>.json; ``bench/report.py`` then builds the page from those
files. The profile needs py-spy (pip install py-spy) and is skipped without it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
BENCHMARKS = ["noop", "mock_llm", "al", "enqueue", "memory", "capture"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-profile", action="store_true", help="do not run bench/profile.py (py-spy)")
    args = parser.parse_args()
    names = list(BENCHMARKS)
    has_py_spy = shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()
    if not args.skip_profile:
        if has_py_spy:
            names.append("profile")
        else:
            print("py-spy is not installed (pip install py-spy): skipping bench/profile.py")
    started = time.monotonic()
    for name in names:
        print(f"=== bench/{name}.py", flush=True)
        t = time.monotonic()
        subprocess.run([sys.executable, str(BENCH / f"{name}.py")], check=True)
        print(f"=== bench/{name}.py took {time.monotonic() - t:.0f} s", flush=True)
    subprocess.run([sys.executable, str(BENCH / "report.py")], check=True)
    print(f"all benchmarks in {(time.monotonic() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()

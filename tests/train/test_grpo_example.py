"""examples/grpo trains a policy that learns: the mean reward of its last steps rises clearly above its first.

A shortened run of docs/training.md's example (stock rq workers, the capturing proxy, the example's vLLM-spelling
server, Producer.batches with a staleness bound, weight_sync + update_resources), on the session's redis-server.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_the_grpo_example_policy_learns(redis_server, tmp_path: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("torch is missing: CI installs the train extra (pip install -e '.[dev]')")
        pytest.skip("the train extra (torch) is not installed")
    out = tmp_path / "grpo.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "grpo" / "train.py"), "--steps", "24", "--out", str(out)]
        + ["--url", redis_server.url, "--plot", str(tmp_path / "reward.png")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = json.loads(out.read_text())["steps"]
    assert len(steps) == 24
    first = statistics.fmean(s["mean_reward"] for s in steps[:4])
    last = statistics.fmean(s["mean_reward"] for s in steps[-4:])
    assert last > first + 0.2, (first, last)
    assert all(s["max_staleness"] is None or s["max_staleness"] <= 1 for s in steps)
    assert all(s["pause_to_drained_seconds"] >= 0 for s in steps)
    # Every sample's ratio used the sampler's own logprobs, captured by the proxy in train mode.
    assert all(s["logprobs_recorded"] == 1.0 for s in steps)
    assert steps[-1]["version"] > steps[0]["version"]
    assert (tmp_path / "reward.png").stat().st_size > 1000

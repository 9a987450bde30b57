"""docs/operations.md's command-line block runs verbatim against a Redis on localhost:6379 (one of the test's
own, inside a private network namespace), every line exiting 0."""

from __future__ import annotations

import re

import pytest

from tests.support.doc_blocks import DOCS, section
from tests.support.isolated import run_isolated
from tests.support.servers import REPO


def operating_block() -> str:
    match = re.search(r"```bash\n(.*?)```", section(DOCS / "operations.md", "## The command line"), flags=re.S)
    assert match is not None
    return match.group(1)


@pytest.mark.redis
@pytest.mark.slow
def test_operations_command_line_block_runs_verbatim_on_localhost() -> None:
    block = operating_block()
    assert "--url" not in block  # it relies on the default, redis://localhost:6379/0

    done = run_isolated("start_redis 6379\nset -x\n" + block, cwd=REPO, timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    assert "example-1\nexample-2\nexample-3\nexample-4\n" in out  # the ids enqueue printed
    assert "state      failed" in out and "KeyError" in out  # rollq task example-4
    assert '"rollout_id": "example-1"' in out  # rollouts get
    assert "example-4\t1 attempt(s)\tKeyError" in out  # dead-letter list
    assert "requeued 1 task(s)" in out

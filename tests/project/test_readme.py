"""The README is a map a newcomer can follow: its two commands come first (the test command is CI's), its
tutorial runs as written against a real Redis, and every page it and docs/ link to exists. The manual's Python
examples (docs/producer.md, docs/workers.md, docs/training.md, docs/agent-lightning.md) run in order as one
session, as a reader would paste them."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.doc_blocks import DOCS, README, REPO, code_blocks, section
from tests.support.servers import RedisServer

LOCAL_REDIS = "redis://localhost:6379/0"


def python_blocks() -> list[str]:
    return code_blocks(README.read_text(), "python")


def first_commands() -> list[str]:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    assert first_block is not None
    return [line for line in first_block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_has_the_two_commands_first() -> None:
    commands = first_commands()
    assert commands[0].endswith("rollq demo")
    assert commands[1].endswith("python -m pytest")


def test_readme_test_command_is_what_ci_runs() -> None:
    test_command = first_commands()[1]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert test_command in ci


def test_readme_gives_the_fast_subset_and_the_time_of_each() -> None:
    text = README.read_text()
    fast = [line for block in code_blocks(text, "bash") for line in block.splitlines() if '-m "not slow"' in line]
    assert fast == ['.venv/bin/python -m pytest -m "not slow"']
    assert "slow: takes about 6 s or more" in (REPO / "pyproject.toml").read_text()  # the marker the subset skips
    times = text[: text.index("## Concepts")]
    assert re.search(r"whole suite takes (about \d+|\d+-\d+) minutes", times)
    assert re.search(r"fast subset, every test not marked `slow`, about \d+ minutes", " ".join(times.split()))
    assert "redis-server" in times and "chromium" in times  # what the tests need installed


def test_readme_is_a_map_of_about_two_hundred_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 230
    for topic in ("producer", "workers", "training", "reliability", "operations", "agent-lightning", "scaling"):
        assert f"(docs/{topic}.md)" in README.read_text(), topic
    assert "(docs/internals.md)" in README.read_text() and "(examples/grpo)" in README.read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_slug(m) for m in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_every_link_of_the_readme_and_docs_leads_to_a_page_and_heading_that_exist() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken


def test_docs_say_what_the_dashboard_and_a_progress_bar_need() -> None:
    assert "pip install 'rollq[dashboard]'" in (DOCS / "operations.md").read_text()
    assert "on_progress=" in section(DOCS / "producer.md", "## Waiting for rollouts")


@pytest.mark.redis
def test_readme_tutorial_runs_as_written_against_a_real_redis(
    own_redis: Callable[..., RedisServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = python_blocks()
    (agent_file,) = [block for block in blocks if block.startswith("# myagent.py\n")]
    (tmp_path / "myagent.py").write_text(agent_file)
    tutorial = section(README, "## Your agent on a real Redis")
    (worker_line,) = [line for line in code_blocks(tutorial, "bash")[0].splitlines() if line.strip()]
    assert worker_line.startswith("rollq ") and "--agent myagent:" in worker_line and LOCAL_REDIS in worker_line
    assert [block for block in blocks if block in tutorial] == blocks  # the README's only Python is the tutorial

    url = own_redis().url
    command = shlex.split(worker_line.replace(LOCAL_REDIS, url))
    command[0] = str(Path(sys.executable).parent / "rollq")
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        namespace: dict[str, object] = {"__name__": "readme"}
        for block in blocks:
            exec(compile(block.replace(LOCAL_REDIS, url), str(README), "exec"), namespace)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        print(log.read_text(errors="replace")[-3000:])

    rollouts = namespace["rollouts"]
    assert isinstance(rollouts, list) and len(rollouts) == 20
    assert all(r.metadata["status"] == "succeeded" and r.final_reward in (0.0, 1.0) for r in rollouts)
    calls = [r.triplets[0] for r in rollouts if r.triplets]
    assert len(calls) == 20 and all(call.prompt["token_ids"] and call.response["token_ids"] for call in calls)
    assert sum(r.final_reward for r in rollouts) >= 10  # temperature 0.2: the simulated model is mostly right
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed if line.startswith("succeeded ")] == ["succeeded"] * 3


def manual_python_blocks() -> list[str]:
    """The manual's runnable examples, in the order a reader meets them: queue (producer.md), run (workers.md),
    turn into a batch (training.md), and Agent Lightning 0.1's server facade (agent-lightning.md)."""
    return [
        *code_blocks((DOCS / "producer.md").read_text(), "python"),
        *code_blocks((DOCS / "workers.md").read_text(), "python"),
        *code_blocks(section(DOCS / "training.md", "## From rollouts to a batch"), "python"),
        *code_blocks(section(DOCS / "agent-lightning.md", "## Agent Lightning 0.1-0.3"), "python"),
    ]


def test_manual_python_examples_run(capsys) -> None:  # type: ignore[no-untyped-def]
    blocks = manual_python_blocks()
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "succeeded" in printed and "1.0" in printed
    batch = namespace["batch"]
    assert isinstance(batch, list)  # to_batch ran on the workers' rollouts

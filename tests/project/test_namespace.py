"""rollq owns one import name: a user's own ``models``, ``producer``, ``worker`` or ``store`` stays the user's."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollq.producer import Producer
from tests.support.servers import RedisServer, WorkerProcess

USER_NAMES = ("models", "producer", "worker", "store", "ops", "compat")


def _user_repository(root: Path) -> Path:
    """A trainer repository with packages named like rollq's folders, and an agent that uses them."""
    (root / "models").mkdir()
    (root / "models" / "__init__.py").write_text("WHOSE = 'the user'\n")
    (root / "producer").mkdir()
    (root / "producer" / "__init__.py").write_text("WHOSE = 'the user'\n")
    (root / "worker.py").write_text("WHOSE = 'the user'\n")
    (root / "user_agent.py").write_text(
        textwrap.dedent(
            """
            import models
            import worker

            from rollq.worker import LitAgent


            class UserAgent(LitAgent):
                def training_rollout(self, task_input, rollout_id, resources):
                    assert models.WHOSE == worker.WHOSE == "the user"
                    return 1.0
            """
        )
    )
    return root


def test_the_distribution_installs_only_the_rollq_import_name() -> None:
    top_level = {name for name, dists in importlib.metadata.packages_distributions().items() if "rollq" in dists}
    assert top_level == {"rollq"}


def test_importing_every_rollq_package_imports_no_top_level_name_of_a_user(tmp_path: Path) -> None:
    _user_repository(tmp_path)
    script = (
        "import sys\n"
        "import rollq.models, rollq.store, rollq.producer, rollq.worker, rollq.ops.cli, rollq.ops.demo\n"
        f"clashes = [n for n in {USER_NAMES!r} if n in sys.modules]\n"
        "assert not clashes, clashes\n"
        "import models, worker\n"
        "assert models.WHOSE == worker.WHOSE == 'the user'\n"
        "print('ok')\n"
    )
    # Started from the user's repository, whose directory is first on sys.path (as `python -c` and rq worker do).
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.redis
def test_a_worker_started_in_a_repository_with_its_own_models_package_runs_rollouts(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "trainer").mkdir()
    repo = _user_repository(tmp_path / "trainer")
    producer = Producer.from_url(redis_server.url, namespace)
    ids = [task.rollout_id for task in producer.enqueue_many([{"n": i} for i in range(3)], mode="train")]
    proc = WorkerProcess(
        redis_server.url,
        namespace,
        tmp_path / "worker.log",
        env={"ROLLQ_AGENT": "user_agent:UserAgent"},
        args=["--burst"],
        cwd=repo,
    )
    try:
        rollouts = producer.wait(ids, timeout=60)
    finally:
        proc.stop(timeout=30)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 3, proc.log()
    assert [r.final_reward for r in rollouts] == [1.0] * 3

"""``rollq demo``: a whole run, producer -> workers -> results, on one machine.

The sample agent calls a simulated LLM served over HTTP by this process
(:mod:`rollq.ops.sim_llm`) with the ``openai`` client; the workers capture every
call with its token ids, and the summary counts the triplets that come back.

Without a URL it starts an embedded fake Redis (served over TCP, so the workers
are real ``rollq worker`` processes) and needs nothing installed. With
``--redis-url`` it runs the same against a real Redis, in its own namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rq import Queue, Worker
from tqdm import tqdm

from rollq.models.policy import RolloutStatus
from rollq.producer import Producer
from rollq.store.connection import describe
from rollq.store.records import read_records
from rollq.worker.sample_agent import sample_inputs, sample_resources

from .sim_llm import SimulatedLLM

SAMPLE_AGENT = "rollq.worker.sample_agent:SampleAgent"


@dataclass
class DemoSummary:
    tasks: int
    succeeded: int
    failed: int
    reward_mean: float
    reward_min: float
    reward_max: float
    seconds: float
    claims: dict[int, int]
    triplets: int = 0
    triplets_with_token_ids: int = 0
    triplets_min: int = 0
    triplets_max: int = 0

    @property
    def triplets_per_rollout(self) -> float:
        rollouts = self.succeeded + self.failed
        return self.triplets / rollouts if rollouts else 0.0

    @property
    def rollouts_per_second(self) -> float:
        return (self.succeeded + self.failed) / self.seconds if self.seconds else 0.0

    def render(self) -> str:
        claims = ", ".join(f"{n} claim(s): {count}" for n, count in sorted(self.claims.items()))
        return "\n".join(
            [
                f"rollouts   {self.succeeded + self.failed} of {self.tasks} tasks "
                f"({self.succeeded} succeeded, {self.failed} failed)",
                f"reward     mean {self.reward_mean:.3f}, min {self.reward_min:.2f}, max {self.reward_max:.2f}",
                f"throughput {self.rollouts_per_second:.1f} rollouts/s end to end ({self.seconds:.2f}s)",
                f"claims     {claims}",
                f"triplets   {self.triplets} ({self.triplets_per_rollout:.2f} per rollout, "
                f"min {self.triplets_min}, max {self.triplets_max}); "
                + (
                    "every triplet carries prompt and response token ids"
                    if self.triplets and self.triplets_with_token_ids == self.triplets
                    else f"{self.triplets_with_token_ids} of {self.triplets} carry token ids"
                ),
            ]
        )


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from rollq.store.embedded import EmbeddedRedis

    with EmbeddedRedis() as embedded:
        yield embedded.url


@contextlib.contextmanager
def worker_processes(
    url: str, namespace: str, count: int, concurrency: int, log_dir: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` ``rollq worker`` processes running the sample agent; SIGTERM (a graceful stop) on exit."""
    procs = []
    for i in range(count):
        log_file = open(log_dir / f"worker-{i}.log", "wb")  # noqa: SIM115  # closed with the process below
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rollq",
                    "--url",
                    url,
                    "--namespace",
                    namespace,
                    "worker",
                    "--agent",
                    SAMPLE_AGENT,
                    "--concurrency",
                    str(concurrency),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    try:
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _await_workers(producer: Producer, procs: list[subprocess.Popen[bytes]], log_dir: Path, timeout: float) -> None:
    # Workers take a second or two to import; the clock starts once they listen.
    queue = Queue(producer.keys.queue_name, connection=producer.connection)
    deadline = time.monotonic() + timeout
    while Worker.count(connection=producer.connection, queue=queue) < len(procs):
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                tail = (log_dir / f"worker-{i}.log").read_text(errors="replace").strip().splitlines()[-1:]
                raise RuntimeError(f"worker {i} exited with code {proc.returncode}: {' '.join(tail) or 'no output'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers did not start within {timeout:.0f}s; logs in {log_dir}")
        time.sleep(0.1)


def run_demo(
    redis_url: str | None = None,
    *,
    tasks: int = 300,
    workers: int = 3,
    concurrency: int = 16,
    namespace: str = "rollq-demo",
    timeout: float = 300.0,
    echo: Callable[[str], None] = print,
) -> DemoSummary:
    """Publish resources, start workers, queue ``tasks`` tasks, collect every rollout, summarise."""
    log_dir = Path(tempfile.mkdtemp(prefix="rollq-demo-"))
    with _redis(redis_url) as url:
        echo(f"Redis: {describe(url)}" + ("" if redis_url else " (embedded fake Redis)"))
        producer = Producer.from_url(url, namespace=namespace)
        with SimulatedLLM() as llm, worker_processes(url, namespace, workers, concurrency, log_dir) as procs:
            resources_id = producer.update_resources(sample_resources(endpoint=llm.url))
            echo(f"resources {resources_id}: LLM 'sim-arith-1' at {llm.url} + f-string prompt template")
            echo(f"{workers} worker processes x concurrency {concurrency}; logs in {log_dir}")
            _await_workers(producer, procs, log_dir, timeout=60)
            started = time.monotonic()
            inputs = sample_inputs(tasks)
            queued = producer.enqueue_many(inputs[: tasks // 2], mode="train") + producer.enqueue_many(
                inputs[tasks // 2 :], mode="val"
            )
            ids = [t.rollout_id for t in queued]
            with tqdm(total=len(ids), desc="rollouts", unit="rollout", file=sys.stderr) as bar:
                rollouts = producer.wait(ids, timeout=timeout, on_progress=bar.update)
            seconds = time.monotonic() - started
        claims = Counter(r.task.num_claims or 0 for r in read_records(producer.connection, producer.keys, ids).values())
    rewards = [r.final_reward for r in rollouts if r.final_reward is not None] or [0.0]
    counts = [len(r.triplets or []) for r in rollouts] or [0]
    with_ids = sum(
        "token_ids" in t.prompt and "token_ids" in t.response
        for r in rollouts
        for t in r.triplets or []
        if isinstance(t.prompt, dict) and isinstance(t.response, dict)
    )
    succeeded = sum(r.metadata.get("status") == RolloutStatus.SUCCEEDED for r in rollouts)
    return DemoSummary(
        tasks=len(ids),
        succeeded=succeeded,
        failed=len(rollouts) - succeeded,
        reward_mean=statistics.fmean(rewards),
        reward_min=min(rewards),
        reward_max=max(rewards),
        seconds=seconds,
        claims=dict(claims),
        triplets=sum(counts),
        triplets_with_token_ids=with_ids,
        triplets_min=min(counts),
        triplets_max=max(counts),
    )

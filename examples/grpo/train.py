"""GRPO on rollq, end to end on two CPU cores: a small policy learns to reverse words.

What runs:

- an OpenAI-compatible inference server for the policy (``server.py``, vLLM's token-id and logprob spelling);
- stock ``rq worker -w rollq.worker.RolloutWorker`` processes running ``agent.ReverseAgent``, whose LLM calls go
  through each worker's capturing proxy (exact token ids, logprobs, the resources version of each call);
- this trainer: it queues groups of tasks ahead of the step it trains (asynchronous RL), reads complete groups
  with ``Producer.batches(max_staleness=...)``, computes the GRPO loss from the recorded token ids and the
  sampler's logprobs (importance ratio, clipped), and publishes new weights inside ``producer.weight_sync()``
  followed by ``update_resources``.

Run (a private redis-server is started unless ``--url`` is given; nothing on it is flushed)::

    python examples/grpo/train.py --steps 40 --out grpo.json --plot docs/grpo_reward.png

Each step's line in ``--out`` holds the mean reward, the staleness of the batch, the groups dropped, and the
seconds from pause to drained.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from policy import LETTERS, WORD_LENGTH, ReversePolicy  # noqa: E402

from rollq.models.contract import LLM  # noqa: E402
from rollq.producer import GroupPolicy, Producer  # noqa: E402
from rollq.train import TokenSample, triplet_samples  # noqa: E402

WORDS = ["".join(letters) for letters in itertools.product(LETTERS, repeat=WORD_LENGTH)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.loads(answer.read()))


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of this run's own on a free port, in a temporary directory; stopped at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: install it, or pass --url redis://...")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rollq-grpo-") as directory:
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                directory,
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            import redis

            client = redis.Redis(port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(10)


@contextlib.contextmanager
def processes(
    commands: list[tuple[list[str], dict[str, str]]], log_dir: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        for n, (command, env) in enumerate(commands):
            log = open(log_dir / f"process-{n}.log", "wb")  # noqa: SIM115  # closed with the process
            started.append(
                subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            )
        yield started
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def grpo_loss(policy: ReversePolicy, samples: list[TokenSample], clip: float = 0.2) -> torch.Tensor:
    """GRPO's clipped surrogate: per token, -min(ratio * A, clip(ratio) * A), ratio = exp(new - old logprob)."""
    losses = []
    for sample in samples:
        new = policy.token_logprobs(sample.prompt_ids, sample.response_ids)
        old = torch.tensor(sample.old_logprobs)
        mask = torch.tensor(sample.response_mask, dtype=torch.float32)
        ratio = torch.exp(new - old)
        advantage = sample.advantage
        per_token = -torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + clip) * advantage)
        losses.append((per_token * mask).sum() / mask.sum().clamp(min=1.0))
    return torch.stack(losses).mean()


def llm_resource(port: int) -> dict[str, LLM]:
    return {
        "policy": LLM(
            endpoint=f"http://127.0.0.1:{port}/v1",
            model="reverse-policy",
            sampling_parameters={"temperature": 1.0},
        )
    }


def train(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    random.seed(args.seed)
    namespace = f"grpo-{os.getpid()}-{int(time.time())}"
    producer = Producer.from_url(url, namespace)
    port = free_port()
    policy = ReversePolicy(seed=args.seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    rq = str(Path(sys.executable).with_name("rq"))
    worker_env = {
        "ROLLQ_AGENT": "examples.grpo.agent:ReverseAgent",
        "ROLLQ_CONCURRENCY": str(args.concurrency),
        # The trainer learns from triplets: succeeded rollouts are published without the trace that repeats their
        # token ids (docs/workers.md, "Keeping the trace"); a failed one keeps its trace, which says why.
        "ROLLQ_ROLLOUT_TRACE": "failed",
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    commands = [([sys.executable, str(HERE / "server.py"), "--port", str(port), "--seed", str(args.seed)], {})]
    commands += [
        ([rq, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, namespace], worker_env)
        for _ in range(args.workers)
    ]
    log_dir = Path(tempfile.mkdtemp(prefix="rollq-grpo-logs-"))
    steps: list[dict[str, Any]] = []
    with processes(commands, log_dir):
        wait_http(f"http://127.0.0.1:{port}/health")
        post_json(f"http://127.0.0.1:{port}/weights", {"version": "v1", "state": policy.state_json()})
        producer.update_resources(llm_resource(port))
        per_step = args.groups * args.group_size

        def queue_step() -> None:
            # Back-pressure: at most (ahead + 1) steps of tasks queued or running, so little goes stale.
            words = random.choices(WORDS, k=args.groups)
            producer.enqueue_many(
                [{"word": w} for w in words],
                mode="train",
                group_size=args.group_size,
                max_pending=(args.ahead + 1) * per_step,
            )

        reader = producer.batches(
            args.groups,
            max_staleness=args.max_staleness,
            timeout=args.batch_timeout,
            policy=GroupPolicy(on_failure="drop"),
        )
        started = time.monotonic()
        for step in range(args.steps):
            for _ in range(1 + args.ahead if step == 0 else 1):
                queue_step()
            batch = reader.next_batch()
            samples = triplet_samples(batch)
            if not samples:
                raise SystemExit("a batch without token ids: is the capturing proxy on (ROLLQ_CAPTURE_LLM)?")
            for _ in range(args.epochs):  # the ratio to the sampler's logprobs keeps later epochs in the clip range
                loss = grpo_loss(policy, samples, clip=args.clip)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            # Weight sync: no LLM call runs while the server swaps weights; the new version is published
            # before the calls resume, so every call after it is stamped with the version it ran against.
            with producer.weight_sync(timeout=60) as pause:
                version = f"v{(batch.latest_version or 1) + 1}"
                post_json(f"http://127.0.0.1:{port}/weights", {"version": version, "state": policy.state_json()})
                producer.update_resources(llm_resource(port))
            line = {
                "step": step + 1,
                "mean_reward": batch.mean_reward,
                "groups": len(batch.groups),
                "max_staleness": batch.max_staleness,
                "stale_dropped": batch.stale_dropped,
                "failed_dropped": batch.failed_dropped,
                "pause_to_drained_seconds": round(pause.seconds_to_drained, 4),
                "loss": round(loss.item(), 5),
                "samples": len(samples),
                "logprobs_recorded": sum(s.logprobs_recorded for s in samples) / len(samples),
                "version": batch.latest_version,
                "batch_wait_seconds": round(batch.seconds, 3),
                "elapsed_seconds": round(time.monotonic() - started, 2),
            }
            steps.append(line)
            print(json.dumps(line), flush=True)
        reader.close()
    return steps


def plot(steps: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([s["step"] for s in steps], [s["mean_reward"] for s in steps], marker="o", markersize=3)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward of the step's groups")
    ax.set_ylim(0, 1.05)
    ax.set_title("examples/grpo: a policy learning to reverse words on rollq")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small policy with GRPO on rollq (CPU, minutes).")
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the per-step JSON")
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of the reward curve (needs matplotlib)")
    parser.add_argument("--url", default=None, help="a Redis URL; default: start a private redis-server")
    parser.add_argument("--workers", type=int, default=2, help="rq worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=32, help="rollouts in flight per worker (default 32)")
    parser.add_argument("--groups", type=int, default=8, help="groups per step (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group (default 8)")
    parser.add_argument("--ahead", type=int, default=1, help="steps of tasks queued ahead of training (default 1)")
    parser.add_argument("--max-staleness", type=int, default=1, help="versions a group may lag (default 1)")
    parser.add_argument("--lr", type=float, default=0.1, help="Adam learning rate (default 0.1)")
    parser.add_argument("--epochs", type=int, default=2, help="gradient steps per batch (default 2)")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range (default 0.2)")
    parser.add_argument("--batch-timeout", type=float, default=120.0, help="seconds to wait for one batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(private_redis())
        steps = train(args, url)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "steps": steps}, indent=1))
    first = statistics.fmean(s["mean_reward"] for s in steps[:5])
    last = statistics.fmean(s["mean_reward"] for s in steps[-5:])
    print(f"mean reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}", flush=True)
    if args.plot is not None:
        plot(steps, args.plot)


if __name__ == "__main__":
    main()

"""``rollq``: run the demo, start workers, queue tasks, manage resources, watch a namespace.

Exit codes: 0 done, 1 the operation failed (unknown id, timeout, bad input),
2 usage error, 3 Redis could not be reached.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import click
import redis
from tqdm import tqdm

from rollq.models.errors import RollqError
from rollq.producer import Producer
from rollq.store.connection import connect, describe, resolve_url
from rollq.store.keys import DEFAULT_NAMESPACE, StreamField

EXIT_FAILED, EXIT_REDIS = 1, 3

F = TypeVar("F", bound=Callable[..., Any])


def _one_line_errors(fn: F) -> F:
    """Turn the errors a user can cause into one clear line and an exit code, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except redis.AuthenticationError as exc:  # before ConnectionError, its base class
            click.echo(f"rollq: Redis refused the credentials: {exc}", err=True)
            sys.exit(EXIT_REDIS)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            url = click.get_current_context().find_root().params.get("url")
            click.echo(f"rollq: cannot reach Redis at {describe(resolve_url(url))}: {exc}", err=True)
            sys.exit(EXIT_REDIS)
        except (RollqError, ValueError, redis.ResponseError) as exc:
            click.echo(f"rollq: {exc}", err=True)
            sys.exit(EXIT_FAILED)

    return wrapper  # type: ignore[return-value]


def _producer(ctx: click.Context) -> Producer:
    root = ctx.find_root().params
    # One quick retry: someone at a terminal wants "Redis is down" now, not in 20 s.
    return Producer(connect(root["url"], retries=1), root["namespace"])


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    envvar=["ROLLQ_REDIS_URL", "REDIS_URL"],
    default=None,
    metavar="URL",
    help="Redis URL: redis://[:password@]host:port/db, rediss:// (TLS), unix://path, memory:// "
    "[env: ROLLQ_REDIS_URL, then REDIS_URL].",
)
@click.option(
    "--namespace",
    "-n",
    envvar="ROLLQ_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace (and RQ queue name) to work in [env: ROLLQ_NAMESPACE].",
)
@click.version_option(package_name="rollq")
def main(url: str | None, namespace: str) -> None:
    """rollq: agent rollouts for RL training on Redis + RQ.

    Start with `rollq demo`, which runs a whole producer -> workers -> results
    round on an embedded Redis with nothing installed.
    """


@main.command()
@click.option(
    "--redis-url",
    default=None,
    metavar="URL",
    help="Run against this Redis with real worker processes (default: embedded fake Redis).",
)
@click.option("--tasks", default=300, show_default=True, help="Tasks to queue.")
@click.option("--workers", default=3, show_default=True, help="Worker processes to start.")
@click.option("--concurrency", default=16, show_default=True, help="Rollouts in flight per worker.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for every rollout.")
@_one_line_errors
def demo(redis_url: str | None, tasks: int, workers: int, concurrency: int, timeout: float) -> None:
    """Run the sample agent end to end and print a summary."""
    from .demo import run_demo

    summary = run_demo(
        redis_url, tasks=tasks, workers=workers, concurrency=concurrency, timeout=timeout, echo=click.echo
    )
    click.echo(summary.render())


@main.command()
@click.option("--agent", envvar="ROLLQ_AGENT", metavar="MODULE:CLASS", help="The LitAgent to run [env: ROLLQ_AGENT].")
@click.option(
    "--hook",
    "hooks",
    multiple=True,
    metavar="MODULE:CLASS",
    help="A Hook to run around each rollout; repeatable [env: ROLLQ_HOOKS, comma-separated].",
)
@click.option(
    "--concurrency",
    "-c",
    type=int,
    default=None,
    help="Rollouts in flight at once [env: ROLLQ_CONCURRENCY; default 1].",
)
@click.option(
    "--grace-seconds", type=float, default=None, help="On SIGTERM, how long running rollouts may finish [default 30]."
)
@click.option("--heartbeat-seconds", type=float, default=None, help="Heartbeat and reaper interval [default 5].")
@click.option(
    "--results-maxlen", type=int, default=None, help="Approximate bound of the results stream [default 100000]."
)
@click.option(
    "--results-max-bytes", type=int, default=None, help="Hard byte limit of the results stream [default 1 GiB]."
)
@click.option("--max-result-bytes", type=int, default=None, help="Largest rollout JSON published [default 8 MiB].")
@click.option("--burst", is_flag=True, help="Quit once the queue is empty.")
@click.option("--name", default=None, help="Worker name (default: RQ's random one).")
@click.option("--worker-ttl", type=int, default=None, help="RQ worker TTL in seconds.")
@click.option("--logging-level", default="INFO", show_default=True)
@click.pass_context
@_one_line_errors
def worker(
    ctx: click.Context,
    agent: str | None,
    hooks: tuple[str, ...],
    concurrency: int | None,
    grace_seconds: float | None,
    heartbeat_seconds: float | None,
    results_maxlen: int | None,
    results_max_bytes: int | None,
    max_result_bytes: int | None,
    burst: bool,
    name: str | None,
    worker_ttl: int | None,
    logging_level: str,
) -> None:
    """Start a worker: the same as `rq worker -w rollq.worker.RolloutWorker --url URL NAMESPACE`."""
    import logging

    from rollq.worker import RolloutWorker, WorkerSettings

    root = ctx.find_root().params
    settings = WorkerSettings.from_env(
        agent=agent,
        hooks=hooks or None,
        concurrency=concurrency,
        grace_seconds=grace_seconds,
        heartbeat_seconds=heartbeat_seconds,
        results_maxlen=results_maxlen,
        results_max_bytes=results_max_bytes,
        max_result_bytes=max_result_bytes,
    )
    logging.basicConfig(level=logging_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kwargs: dict[str, Any] = {"name": name} if name else {}
    if worker_ttl:
        kwargs["worker_ttl"] = worker_ttl
    w = RolloutWorker([root["namespace"]], connection=connect(root["url"]), settings=settings, **kwargs)
    w.work(burst=burst, logging_level=logging_level)


def _jsonl(stream: IO[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {number}: not JSON ({exc.msg})") from exc
        if not isinstance(entry, dict) or "input" not in entry:
            raise ValueError(f'line {number}: expected an object with an "input" key')
        unknown = set(entry) - {"input", "rollout_id", "mode", "resources_id", "metadata"}
        if unknown:
            raise ValueError(f"line {number}: unknown key(s) {', '.join(sorted(unknown))}")
        yield number, entry


@main.command()
@click.argument("source", type=click.File("r"), default="-")
@click.option(
    "--mode", type=click.Choice(["train", "val", "test"]), default=None, help="Mode for lines that give none."
)
@click.option(
    "--resources-id", default=None, help="Resources version for lines that give none (default: latest at run time)."
)
@click.pass_context
@_one_line_errors
def enqueue(ctx: click.Context, source: IO[str], mode: str | None, resources_id: str | None) -> None:
    """Queue tasks from a JSONL file (or stdin), one object per line.

    Each line: {"input": ..., "rollout_id"?, "mode"?, "resources_id"?, "metadata"?}.

    Prints the rollout id of each task queued.
    """
    producer = _producer(ctx)
    entries = [entry for _, entry in _jsonl(source)]

    def batch_key(entry: dict[str, Any]) -> tuple[Any, ...]:
        options = (entry.get("mode", mode), entry.get("resources_id", resources_id))
        return (*options, json.dumps(entry.get("metadata"), sort_keys=True))

    # Consecutive lines that share their options go out as one batch (one round trip per 2000).
    with tqdm(total=len(entries), desc="enqueue", unit="task", file=sys.stderr, disable=len(entries) < 1000) as bar:
        for (line_mode, line_resources, _), group in itertools.groupby(entries, key=batch_key):
            batch = list(group)
            tasks = producer.enqueue_many(
                [entry["input"] for entry in batch],
                mode=line_mode,
                resources_id=line_resources,
                metadata=batch[0].get("metadata"),
                rollout_ids=[entry.get("rollout_id") or f"rollout-{uuid.uuid4().hex}" for entry in batch],
            )
            click.echo("\n".join(task.rollout_id for task in tasks))
            bar.update(len(batch))


@main.group()
def resources() -> None:
    """Publish and inspect resources versions."""


@resources.command("set")
@click.argument("source", type=click.File("r"), default="-")
@click.pass_context
@_one_line_errors
def resources_set(ctx: click.Context, source: IO[str]) -> None:
    """Publish a new version from JSON: {"name": {"resource_type": "llm", ...}, ...}. Prints its id."""
    try:
        named = json.load(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"resources are not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    click.echo(_producer(ctx).update_resources(named))


@resources.command("get")
@click.argument("resources_id", required=False)
@click.pass_context
@_one_line_errors
def resources_get(ctx: click.Context, resources_id: str | None) -> None:
    """Print a version as JSON (the latest without an id)."""
    click.echo(_producer(ctx).get_resources(resources_id).model_dump_json(indent=2))


@resources.command("list")
@click.pass_context
@_one_line_errors
def resources_list(ctx: click.Context) -> None:
    """List the kept versions, oldest first; the latest is marked with *."""
    store = _producer(ctx).resources
    latest = store.latest_id()
    for version in store.versions():
        click.echo(f"{version}{' *' if version == latest else ''}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--prometheus", is_flag=True, help="Prometheus text exposition format.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="Refresh every SECONDS until Ctrl+C.")
@click.pass_context
@_one_line_errors
def status(ctx: click.Context, as_json: bool, prometheus: bool, watch: float | None) -> None:
    """Queued, in flight by worker, finished, failed, dead-letter, stale attempts, stream lag, resources."""
    from .metrics import render_prometheus
    from .status import render_text, snapshot

    producer = _producer(ctx)
    while True:
        s = snapshot(producer.connection, producer.keys)
        text = json.dumps(s.to_dict(), indent=2) if as_json else render_prometheus(s) if prometheus else render_text(s)
        if watch:
            click.clear()
        click.echo(text.rstrip("\n"))
        if not watch:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return


@main.group()
def rollouts() -> None:
    """Read finished rollouts."""


@rollouts.command("tail")
@click.option(
    "--group",
    default=None,
    help="Read as a member of this consumer group (acknowledged, shared); default: just follow the stream.",
)
@click.option("--from-start", is_flag=True, help="Start at the oldest entry instead of new ones.")
@click.option("--count", type=int, default=None, help="Stop after this many rollouts.")
@click.pass_context
@_one_line_errors
def rollouts_tail(ctx: click.Context, group: str | None, from_start: bool, count: int | None) -> None:
    """Print finished rollouts as JSON lines as they arrive, until Ctrl+C."""
    producer = _producer(ctx)
    try:
        if group:
            for n, rollout in enumerate(producer.rollouts(group, start="0" if from_start else "$"), 1):
                click.echo(rollout.model_dump_json())
                if count and n >= count:
                    return
            return
        cursor = "0-0" if from_start else "$"
        seen = 0
        while True:
            reply: Any = producer.connection.xread({producer.keys.results: cursor}, count=100, block=1000)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    cursor = entry_id
                    click.echo(fields[StreamField.ROLLOUT.encode()].decode())
                    seen += 1
                    if count and seen >= count:
                        return
    except KeyboardInterrupt:
        return


@main.group("dead-letter")
def dead_letter() -> None:
    """Tasks that failed for good."""


@dead_letter.command("list")
@click.pass_context
@_one_line_errors
def dead_letter_list(ctx: click.Context) -> None:
    """Print the dead-lettered rollout ids, oldest first."""
    for rid in _producer(ctx).dead_letter():
        click.echo(rid)


@dead_letter.command("requeue")
@click.argument("rollout_ids", nargs=-1)
@click.option("--all", "requeue_all", is_flag=True, help="Requeue every dead-lettered task.")
@click.pass_context
@_one_line_errors
def dead_letter_requeue(ctx: click.Context, rollout_ids: tuple[str, ...], requeue_all: bool) -> None:
    """Queue dead-lettered tasks again with a fresh attempt budget."""
    if not rollout_ids and not requeue_all:
        raise click.UsageError("name rollout ids or pass --all")
    done = _producer(ctx).requeue_dead(None if requeue_all else list(rollout_ids))
    click.echo(f"requeued {len(done)} task(s)")
    missing = set(rollout_ids) - set(done)
    if missing:
        click.echo(f"not in the dead-letter list: {', '.join(sorted(missing))}", err=True)
        sys.exit(EXIT_FAILED)


@main.command()
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (keep it local; the dashboard has no auth).",
)
@click.option("--port", default=9181, show_default=True)
@click.pass_context
@_one_line_errors
def dashboard(ctx: click.Context, bind: str, port: int) -> None:
    """Start rq-dashboard on this Redis with the JSON serializer (needs rollq[dashboard])."""
    from .dashboard import serve

    serve(resolve_url(ctx.find_root().params["url"]), bind=bind, port=port)

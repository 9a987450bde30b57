"""``rollq``: run the demo, start workers, queue tasks, manage resources, watch a namespace.

Exit codes: 0 done, 1 the operation failed (unknown id, timeout, bad input),
2 usage error, 3 Redis could not be reached. Without ``--url`` (or
``ROLLQ_REDIS_URL`` / ``REDIS_URL``) every command uses ``redis://localhost:6379/0``.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

import click
import redis
from pydantic import ValidationError
from tqdm import tqdm

from rollq.models.contract import Task
from rollq.models.errors import RollqError
from rollq.producer import Producer
from rollq.store.connection import check_reachable, connect, describe, resolve_url
from rollq.store.keys import DEFAULT_NAMESPACE, StreamField
from rollq.worker import logs
from rollq.worker.config import warn_unknown

log = logging.getLogger("rollq.cli")

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
        except ValidationError as exc:  # before ValueError, its base class: pydantic's report is many lines
            click.echo(f"rollq: {_validation_line(exc)}", err=True)
            sys.exit(EXIT_FAILED)
        except (RollqError, ValueError, redis.ResponseError) as exc:
            click.echo("rollq: " + " ".join(str(exc).split()), err=True)
            sys.exit(EXIT_FAILED)

    return wrapper  # type: ignore[return-value]


def _validation_line(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or exc.title
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _url(ctx: click.Context) -> str:
    """The Redis URL this run uses, after checking it answers (within the connect timeout, not minutes)."""
    url = check_reachable(ctx.find_root().params["url"])
    log.info("Redis at %s", describe(url))
    return url


def _producer(ctx: click.Context) -> Producer:
    # One quick retry: someone at a terminal wants "Redis is down" now, not in 20 s.
    return Producer(connect(_url(ctx), retries=1), ctx.find_root().params["namespace"])


class _OneLineUsageGroup(click.Group):
    """click's group, with usage errors as one line (and exit 2) like every other error, not a usage block."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            hint = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            click.echo(f"rollq: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"rollq: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("rollq: aborted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_OneLineUsageGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    envvar=["ROLLQ_REDIS_URL", "REDIS_URL"],
    default=None,
    metavar="URL",
    help="Redis URL: redis://[:password@]host:port/db, rediss:// (TLS), unix://path, "
    "redis+sentinel://host:port[,host:port]/service[/db], memory:// "
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
@click.option(
    "--log-format",
    envvar="ROLLQ_LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines as text or one JSON object each [env: ROLLQ_LOG_FORMAT].",
)
@click.option(
    "--log-level",
    envvar="ROLLQ_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="Log level of short commands (INFO also names the Redis used); the worker has --logging-level.",
)
@click.version_option(package_name="rollq")
def main(url: str | None, namespace: str, log_format: str, log_level: str) -> None:
    """rollq: agent rollouts for RL training on Redis + RQ.

    Start with `rollq demo`, which runs a whole producer -> workers -> results
    round on an embedded Redis with nothing installed. Every other command uses
    --url, else ROLLQ_REDIS_URL, else REDIS_URL, else redis://localhost:6379/0.

    Shell completion: eval "$(_ROLLQ_COMPLETE=bash_source rollq)" in ~/.bashrc
    (zsh_source for zsh, fish_source for fish).
    """
    logs.configure(log_level.upper(), log_format)  # type: ignore[arg-type]
    warn_unknown(os.environ)


@main.command()
@click.option(
    "--redis-url", default=None, metavar="URL", hidden=True, help="Same as the global --url (older spelling)."
)
@click.option("--tasks", default=300, show_default=True, help="Tasks to queue.")
@click.option("--workers", default=3, show_default=True, help="Worker processes to start.")
@click.option("--concurrency", default=16, show_default=True, help="Rollouts in flight per worker.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for every rollout.")
@click.pass_context
@_one_line_errors
def demo(ctx: click.Context, redis_url: str | None, tasks: int, workers: int, concurrency: int, timeout: float) -> None:
    """Run the sample agent end to end and print a summary.

    With no URL at all (or --url memory://) it starts an embedded fake Redis
    and says so; with --url (or ROLLQ_REDIS_URL) it runs on that Redis, in the
    namespace rollq-demo.
    """
    from .demo import run_demo

    url = redis_url or ctx.find_root().params["url"]
    if url and not url.startswith("memory:"):
        url = _url(ctx) if not redis_url else check_reachable(redis_url)
    else:
        url = None
    summary = run_demo(url, tasks=tasks, workers=workers, concurrency=concurrency, timeout=timeout, echo=click.echo)
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
@click.option(
    "--path",
    "paths",
    multiple=True,
    metavar="DIR",
    help="Also import from DIR (repeatable); the current directory always is, as with rq worker.",
)
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
    paths: tuple[str, ...],
) -> None:
    """Start a worker: the same as `rq worker -w rollq.worker.RolloutWorker --url URL NAMESPACE`."""
    from rollq.worker import RolloutWorker, WorkerSettings

    # `rq worker` imports jobs from the current directory; so does this, for --agent and --hook.
    for directory in reversed(("", *paths)):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    root = ctx.find_root().params
    settings = WorkerSettings.from_env(
        log_format=root["log_format"],
        agent=agent,
        hooks=hooks or None,
        concurrency=concurrency,
        grace_seconds=grace_seconds,
        heartbeat_seconds=heartbeat_seconds,
        results_maxlen=results_maxlen,
        results_max_bytes=results_max_bytes,
        max_result_bytes=max_result_bytes,
    )
    logs.configure(logging_level, settings.log_format)
    url = _url(ctx)
    kwargs: dict[str, Any] = {"name": name} if name else {}
    if worker_ttl:
        kwargs["worker_ttl"] = worker_ttl
    try:
        # --url (or its env) already decided the Redis; RolloutWorker's ROLLQ_REDIS_URL check is for stock rq worker.
        w = RolloutWorker(
            [root["namespace"]], connection=connect(url), settings=settings, honour_rollq_url=False, **kwargs
        )
    except TypeError as exc:  # --agent names something that is not a LitAgent
        raise ValueError(str(exc)) from exc
    w.work(burst=burst, logging_level=logging_level)


_LINE_KEYS = {"input", "rollout_id", "mode", "resources_id", "metadata"}


def _parse_line(number: int, line: str, mode: str | None, resources_id: str | None) -> Task:
    """One JSONL line as a Task (with the command's defaults), or ValueError naming the line."""
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {number}: not JSON ({exc.msg})") from exc
    if not isinstance(entry, dict) or "input" not in entry:
        raise ValueError(f'line {number}: expected an object with an "input" key')
    unknown = set(entry) - _LINE_KEYS
    if unknown:
        raise ValueError(f"line {number}: unknown key(s) {', '.join(sorted(unknown))}")
    try:
        return Task(
            rollout_id=entry.get("rollout_id") or f"rollout-{uuid.uuid4().hex}",
            input=entry["input"],
            mode=entry.get("mode", mode),
            resources_id=entry.get("resources_id", resources_id),
            metadata=entry.get("metadata") or {},
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"line {number}: {where}: {first['msg']}") from exc


def _read_tasks(stream: IO[str], mode: str | None, resources_id: str | None) -> list[Task]:
    """Every line of ``stream`` as a Task, checked before anything is queued; the error names each bad line."""
    tasks, errors = [], []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            tasks.append(_parse_line(number, line, mode, resources_id))
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        more = f" (and {len(errors) - 1} more bad line(s))" if len(errors) > 1 else ""
        raise ValueError(f"{errors[0]}{more}; nothing was queued")
    ids = [t.rollout_id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(rid for rid in ids if ids.count(rid) > 1)
        raise ValueError(f"rollout id {dup!r} appears on more than one line; nothing was queued")
    return tasks


@main.command()
@click.argument("source", type=click.File("r"), default="-")
@click.option(
    "--mode", type=click.Choice(["train", "val", "test"]), default=None, help="Mode for lines that give none."
)
@click.option(
    "--resources-id", default=None, help="Resources version for lines that give none (default: latest at run time)."
)
@click.option(
    "--timeout",
    "timeout_seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Hard limit per attempt, seconds [default 300].",
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=None, help="Attempts per task [default 3].")
@click.option(
    "--retry-on",
    type=click.Choice(["exception", "timeout", "unresponsive"]),
    multiple=True,
    help="Failure kinds that get another attempt; repeatable [default: timeout, unresponsive].",
)
@click.pass_context
@_one_line_errors
def enqueue(
    ctx: click.Context,
    source: IO[str],
    mode: str | None,
    resources_id: str | None,
    timeout_seconds: float | None,
    max_attempts: int | None,
    retry_on: tuple[str, ...],
) -> None:
    """Queue tasks from a JSONL file (or stdin), one object per line.

    Each line: {"input": ..., "rollout_id"?, "mode"?, "resources_id"?, "metadata"?}.
    The whole file is checked first: one bad line queues nothing. A rollout id
    already known is not queued again (so re-running a file is safe).

    Prints the rollout id of each line, then (on stderr) how many were new.
    """
    from rollq.models.policy import RolloutPolicy

    tasks = _read_tasks(source, mode, resources_id)
    producer = _producer(ctx)
    pinned = sorted({t.resources_id for t in tasks if t.resources_id})
    missing = [rid for rid in pinned if not producer.connection.exists(producer.keys.resources(rid))]
    if missing:
        raise ValueError(
            f"unknown resources id(s) {', '.join(missing)} in namespace {producer.namespace!r}; nothing was queued"
        )
    overrides = {
        "timeout_seconds": timeout_seconds,
        "max_attempts": max_attempts,
        "retry_on": frozenset(retry_on) or None,
    }
    policy = producer.policy.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    RolloutPolicy.model_validate(policy.model_dump())  # model_copy skips validation

    def batch_key(task: Task) -> tuple[Any, ...]:
        return (task.mode, task.resources_id, json.dumps(task.metadata, sort_keys=True, default=str))

    new = known = 0
    # Consecutive lines that share their options go out as one batch (one round trip per 2000).
    with tqdm(total=len(tasks), desc="enqueue", unit="task", file=sys.stderr, disable=len(tasks) < 1000) as bar:
        for (line_mode, line_resources, _), group in itertools.groupby(tasks, key=batch_key):
            batch = list(group)
            started = time.time()
            queued = producer.enqueue_many(
                [task.input for task in batch],
                mode=line_mode,
                resources_id=line_resources,
                metadata=batch[0].metadata,
                rollout_ids=[task.rollout_id for task in batch],
                policy=policy,
            )
            # A known id comes back as the stored task, created before this call began.
            fresh = sum(1 for task in queued if (task.create_time or 0) >= started)
            new, known = new + fresh, known + len(queued) - fresh
            click.echo("\n".join(task.rollout_id for task in queued))
            bar.update(len(batch))
    click.echo(f"queued {new} new task(s); {known} already known (not queued again)", err=True)


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
    if not isinstance(named, dict):
        raise ValueError(
            "resources must be a JSON object of name -> resource, "
            f'e.g. {{"main_llm": {{"resource_type": "llm", ...}}}}; got a JSON {type(named).__name__}'
        )
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

    if as_json and prometheus:
        raise click.UsageError("--json and --prometheus are two output formats: pick one")
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


@rollouts.command("get")
@click.argument("rollout_id")
@click.pass_context
@_one_line_errors
def rollouts_get(ctx: click.Context, rollout_id: str) -> None:
    """Print the final rollout of a finished task as JSON."""
    from .lookup import final_rollout

    click.echo(final_rollout(_producer(ctx), rollout_id).model_dump_json(indent=2))


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


@main.command()
@click.argument("rollout_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_one_line_errors
def task(ctx: click.Context, rollout_id: str, as_json: bool) -> None:
    """Show one task: state, attempts, worker, times, policy, and the error if it failed."""
    from .lookup import task_view

    view = task_view(_producer(ctx), rollout_id)
    click.echo(json.dumps(view.to_dict(), indent=2) if as_json else view.render())


@main.group("dead-letter")
def dead_letter() -> None:
    """Tasks that failed for good."""


@dead_letter.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@_one_line_errors
def dead_letter_list(ctx: click.Context, as_json: bool) -> None:
    """Print the dead-lettered tasks, oldest first: rollout id, attempts, error type and message."""
    from .lookup import failures

    for failure in failures(_producer(ctx)):
        if as_json:
            click.echo(json.dumps(failure.to_dict()))
        else:
            click.echo(f"{failure.rollout_id}\t{failure.attempts} attempt(s)\t{failure.error_type}: {failure.message}")


@dead_letter.command("requeue")
@click.argument("rollout_ids", nargs=-1)
@click.option("--all", "requeue_all", is_flag=True, help="Requeue every dead-lettered task.")
@click.pass_context
@_one_line_errors
def dead_letter_requeue(ctx: click.Context, rollout_ids: tuple[str, ...], requeue_all: bool) -> None:
    """Queue dead-lettered tasks again with a fresh attempt budget."""
    if not rollout_ids and not requeue_all:
        raise click.UsageError("name rollout ids or pass --all")
    if rollout_ids and requeue_all:
        raise click.UsageError("name rollout ids or pass --all, not both")
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
@click.option("--threads", default=8, show_default=True, help="Request threads of the WSGI server (waitress).")
@click.pass_context
@_one_line_errors
def dashboard(ctx: click.Context, bind: str, port: int, threads: int) -> None:
    """Serve rq-dashboard, rollq's rollout pages (/rollq/) and /metrics (needs rollq[dashboard]).

    Refuses to start when Redis does not answer.
    """
    from .dashboard import serve

    serve(_url(ctx), ctx.find_root().params["namespace"], bind=bind, port=port, threads=threads)


@main.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9182, show_default=True)
@click.pass_context
@_one_line_errors
def metrics(ctx: click.Context, bind: str, port: int) -> None:
    """Serve the namespace's metrics on http://BIND:PORT/metrics for Prometheus to scrape, until Ctrl+C."""
    from prometheus_client import start_http_server

    from .metrics import registry
    from .status import snapshot

    producer = _producer(ctx)
    server, thread = start_http_server(
        port, addr=bind, registry=registry(lambda: snapshot(producer.connection, producer.keys))
    )
    click.echo(
        f"rollq metrics for {producer.namespace!r} in {describe(resolve_url(ctx.find_root().params['url']))} "
        f"on http://{bind}:{port}/metrics",
        err=True,
    )
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        server.shutdown()


from rollq.compat.agl1.cli import serve_agl  # noqa: E402
from rollq.compat.serve_al import serve_al  # noqa: E402  # kept at the end: few lines to merge
from rollq.ops.tasks_cli import tasks  # noqa: E402

main.add_command(serve_al)
main.add_command(serve_agl)
main.add_command(tasks)

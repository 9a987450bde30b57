"""``rollq``: run the demo, start workers, queue tasks, manage resources, watch a namespace.

The group and its global options are here; each command group is a module of this package (``demo``,
``worker``, ``enqueue``, ``resources``, ``tasks``, ``dead_letter``, ``rollouts``, ``status``, ``serve``), and
``serve-al`` and ``serve-agl`` are :mod:`rollq.compat`'s. Errors and exit codes: :mod:`rollq.ops.cli.errors`.
Settings come from the flags, then the environment, then ``.env`` (:mod:`rollq.store.settings`); without ``--url`` (or
``ROLLQ_REDIS_URL`` / ``REDIS_URL``) every command uses ``redis://localhost:6379/0``.
"""

from __future__ import annotations

import click

from rollq.compat.agl1.cli import serve_agl
from rollq.compat.serve_al import serve_al
from rollq.store.keys import DEFAULT_NAMESPACE
from rollq.store.settings import environ
from rollq.worker import logs
from rollq.worker.config import warn_unknown

from . import context, dead_letter, demo, enqueue, groups, resources, rollouts, serve, status, tasks, worker
from .errors import OneLineUsageGroup


@click.group(cls=OneLineUsageGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    envvar=["ROLLQ_REDIS_URL", "REDIS_URL"],
    default=None,
    metavar="URL",
    help="Redis URL: redis://[:password@]host:port/db, rediss:// (TLS), unix://path, "
    "redis+sentinel://host:port[,host:port]/service[/db], memory:// "
    "[env or .env: ROLLQ_REDIS_URL, then REDIS_URL].",
)
@click.option(
    "--namespace",
    "-n",
    envvar="ROLLQ_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace (and RQ queue name) to work in [env or .env: ROLLQ_NAMESPACE].",
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
@click.pass_context
def main(ctx: click.Context, url: str | None, namespace: str, log_format: str, log_level: str) -> None:
    """rollq: agent rollouts for RL training on Redis + RQ.

    Start with `rollq demo`, which runs a whole producer -> workers -> results
    round on an embedded Redis with nothing installed. Every other command uses
    --url, else ROLLQ_REDIS_URL, else REDIS_URL, else redis://localhost:6379/0.

    Shell completion: eval "$(_ROLLQ_COMPLETE=bash_source rollq)" in ~/.bashrc
    (zsh_source for zsh, fish_source for fish).
    """
    settings = context.load_settings(ctx)
    logs.configure(settings.log_level.upper(), settings.log_format)  # type: ignore[arg-type]
    warn_unknown(environ())


for command in (
    demo.demo,
    worker.worker,
    enqueue.enqueue,
    resources.resources,
    status.status,
    rollouts.rollouts,
    groups.groups,
    tasks.task,
    tasks.tasks,
    dead_letter.dead_letter,
    serve.dashboard,
    serve.metrics,
    serve_al,
    serve_agl,
):
    main.add_command(command)

__all__ = ["main"]

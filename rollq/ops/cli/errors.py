"""How the ``rollq`` command reports what went wrong: one line and an exit code, never a traceback or a usage block.

Exit codes: 0 done, 1 the operation failed (unknown id, timeout, bad input), 2 usage error, 3 Redis could not be
reached.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
import redis
from pydantic import ValidationError

from rollq.models.errors import RollqError
from rollq.store.connection import describe, resolve_url

EXIT_FAILED, EXIT_REDIS = 1, 3

F = TypeVar("F", bound=Callable[..., Any])


class RedisLostError(Exception):
    """A command lost Redis partway, its message saying what was done and how to go on: one line, exit 3."""


def one_line_errors(fn: F) -> F:
    """Turn the errors a user can cause into one clear line and an exit code, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except redis.AuthenticationError as exc:  # before ConnectionError, its base class
            click.echo(f"rollq: Redis refused the credentials: {exc}", err=True)
            sys.exit(EXIT_REDIS)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            click.echo(f"rollq: cannot reach Redis at {redis_at()}: {exc}", err=True)
            sys.exit(EXIT_REDIS)
        except RedisLostError as exc:
            click.echo(f"rollq: {exc}", err=True)
            sys.exit(EXIT_REDIS)
        except ValidationError as exc:  # before ValueError, its base class: pydantic's report is many lines
            click.echo(f"rollq: {validation_line(exc)}", err=True)
            sys.exit(EXIT_FAILED)
        except (RollqError, ValueError, redis.ResponseError) as exc:
            click.echo("rollq: " + " ".join(str(exc).split()), err=True)
            sys.exit(EXIT_FAILED)

    return wrapper  # type: ignore[return-value]


def redis_at() -> str:
    """The Redis URL of the running command, for a message (its password masked)."""
    return describe(resolve_url(click.get_current_context().find_root().params.get("url")))


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis could not be reached (exit 3), not that it refused the credentials."""
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
        exc, redis.AuthenticationError
    )


def validation_line(exc: ValidationError) -> str:
    """Pydantic's report of ``exc`` in one line: where the first problem is, what it is, how many more."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or exc.title
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


class OneLineUsageGroup(click.Group):
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

"""rollq: agent rollouts for RL training on Redis + RQ.

One import name, five layers, each importing only the ones above it in this list:

- :mod:`rollq.models`: the data contract (Task, Rollout, Triplet, LLM, ...), policy types, errors;
- :mod:`rollq.store`: how that lives in Redis: key layout, Lua transitions, records, resources, reaper;
- :mod:`rollq.producer`: the trainer side (``Producer``, results);
- :mod:`rollq.worker`: the worker side (``RolloutWorker``, ``LitAgent``, runner, tracer);
- :mod:`rollq.ops`: the ``rollq`` command, status, metrics, dashboard, demo.

Each subpackage is a folder of ``rollq/``: the files live where their import name says, so a checkout, an
editable install, a wheel, tracebacks and coverage all name the same paths.
"""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    """``__version__``, read from the installed package's metadata when first asked for: importlib.metadata costs
    every worker process 30-120 ms of start-up (email, calendar, ...) that almost none of them needs."""
    if name != "__version__":
        raise AttributeError(f"module 'rollq' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("rollq")
    except PackageNotFoundError:  # imported from a source checkout that was never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value

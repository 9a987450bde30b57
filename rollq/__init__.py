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

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rollq")
except PackageNotFoundError:  # imported from a source checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]

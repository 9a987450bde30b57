"""rollq: agent rollouts for RL training on Redis + RQ.

One import name, five layers, each importing only the ones above it in this list:

- :mod:`rollq.models`: the data contract (Task, Rollout, Triplet, LLM, ...), policy types, errors;
- :mod:`rollq.store`: how that lives in Redis: key layout, Lua transitions, records, resources, reaper;
- :mod:`rollq.producer`: the trainer side (``Producer``, results);
- :mod:`rollq.worker`: the worker side (``RolloutWorker``, ``LitAgent``, runner, tracer);
- :mod:`rollq.ops`: the ``rollq`` command, status, metrics, dashboard, demo.

In the source tree each subpackage is a top-level folder (``models/``, ``store/``, ...); ``rollq/`` holds links
to them, so a checkout, an editable install and a wheel all import the same ``rollq.*`` names and nothing else.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rollq")
except PackageNotFoundError:  # imported from a source checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]

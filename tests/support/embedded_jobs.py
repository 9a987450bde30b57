"""Job functions for tests and benchmarks that run a real ``rq worker`` subprocess.

The worker imports them as ``embedded_jobs.<name>``, with this directory on its PYTHONPATH
(``tests`` is not a package).
"""


def noop() -> None:
    """Does nothing: a job whose cost is RQ's bookkeeping alone."""

"""The trainer side of rollq: :class:`Producer` queues tasks and collects rollouts; ``rollq`` is the CLI."""

from .producer import Producer
from .results import ResultReader

__all__ = ["Producer", "ResultReader"]

"""The trainer side of rollq: :class:`Producer` queues tasks and collects rollouts or training batches."""

from .batches import Batch, BatchReader, BatchTimeoutError, ReaderBusyError
from .groups import Group, GroupPolicy
from .producer import Producer
from .results import ResultReader
from .shards import Shards

__all__ = [
    "Batch",
    "BatchReader",
    "BatchTimeoutError",
    "Group",
    "GroupPolicy",
    "Producer",
    "ReaderBusyError",
    "ResultReader",
    "Shards",
]

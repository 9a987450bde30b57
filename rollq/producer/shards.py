"""One training run over several shards: a namespace on each of several Redis servers, used as one.

Past what one Redis serves (docs/scaling.md), a run is split by namespace over separate servers, each with its
own replica and Sentinels: every key of a namespace lives on one server, so shards never talk to each other.
:class:`Shards` is the producer and trainer side of that: each :meth:`enqueue_many` goes whole to the next shard
in turn (a call's tasks, GRPO groups included, stay together), :meth:`wait` asks each shard for the ids it was
given, and :meth:`rollouts` reads every shard's consumer group on a thread of its own and hands the rollouts
over as one stream, each (rollout id, generation) once. Workers each serve one shard's namespace.

On a Redis Cluster the shards are the cluster's primaries: :meth:`Shards.from_cluster` gives each of several
cluster namespaces (``{name}``, see :func:`rollq.store.cluster.spread_namespaces`) a producer that talks to the
primary owning its slot (docs/scaling.md, "Redis Cluster").
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from rollq.models.contract import Rollout, Task, TaskInput
from rollq.models.errors import UnknownTaskError
from rollq.store.keys import DEFAULT_NAMESPACE

from .producer import Producer
from .results import Delivered

_END = object()


class Shards:
    """Several :class:`Producer` (one per shard) used as one. ``from_urls`` builds them from URLs."""

    def __init__(self, producers: Sequence[Producer]) -> None:
        if not producers:
            raise ValueError("Shards needs at least one producer")
        self.producers = list(producers)
        self._next = itertools.cycle(range(len(self.producers)))
        self._lock = threading.Lock()
        self._shard_of: dict[str, int] = {}

    @classmethod
    def from_urls(cls, urls: Sequence[str], namespace: str = DEFAULT_NAMESPACE, **kwargs: Any) -> Shards:
        """A producer per URL, on ``namespace`` (the same name on every shard); ``kwargs`` go to each."""
        return cls([Producer.from_url(url, namespace, **kwargs) for url in urls])

    @classmethod
    def from_cluster(cls, url: str, namespaces: Sequence[str], **kwargs: Any) -> Shards:
        """A producer per cluster namespace (``{name}``) over the seeds of ``url``
        (``redis+cluster://host:port[,host:port...]``, any path ignored); ``kwargs`` go to each."""
        seeds = urlsplit(url)._replace(path="", query="").geturl()
        return cls([Producer.from_url(f"{seeds}/{name.strip('{}')}", name, **kwargs) for name in namespaces])

    def enqueue_many(self, inputs: Sequence[TaskInput], **kwargs: Any) -> list[Task]:
        """:meth:`Producer.enqueue_many` on the next shard in turn; remembers which shard holds each task."""
        with self._lock:
            index = next(self._next)
        tasks = self.producers[index].enqueue_many(inputs, **kwargs)
        with self._lock:
            for task in tasks:
                self._shard_of[task.rollout_id] = index
        return tasks

    def shard_of(self, rollout_id: str) -> Producer:
        """The producer of the shard that holds ``rollout_id`` (queued through this object, or found by asking)."""
        index = self._shard_of.get(rollout_id)
        if index is None:
            for i, producer in enumerate(self.producers):
                if producer.connection.exists(producer.keys.task(rollout_id)):
                    index = self._shard_of[rollout_id] = i
                    break
            else:
                raise UnknownTaskError(rollout_id, self.producers[0].namespace)
        return self.producers[index]

    def wait(self, rollout_ids: Sequence[str], timeout: float) -> list[Rollout]:
        """The rollouts of ``rollout_ids`` in that order: each shard's :meth:`Producer.wait` for its own ids, at
        the same time. Raises what a shard's wait raises (the first to fail)."""
        by_shard: dict[int, list[str]] = {}
        for rid in dict.fromkeys(rollout_ids):
            by_shard.setdefault(self.producers.index(self.shard_of(rid)), []).append(rid)
        found: dict[str, Rollout] = {}
        with ThreadPoolExecutor(max_workers=len(by_shard) or 1, thread_name_prefix="rollq-shard-wait") as pool:
            futures = [pool.submit(self.producers[i].wait, ids, timeout) for i, ids in by_shard.items()]
            for future in futures:
                found.update((r.rollout_id, r) for r in future.result())
        return [found[rid] for rid in rollout_ids]

    def rollouts(
        self, group: str = "trainers", *, idle_timeout: float | None = None, **kwargs: Any
    ) -> Iterator[Rollout]:
        """Every shard's finished rollouts as one stream: a consumer-group reader per shard (at-least-once per
        shard, see :meth:`Producer.rollouts`), each on a thread, into one bounded queue; each (rollout id,
        generation) is handed over once. Ends when every shard's reader has been idle ``idle_timeout`` seconds
        (None: never). A reader's error is raised here."""
        merged: queue.Queue[Any] = queue.Queue(maxsize=10_000)
        stop = threading.Event()

        def drain(producer: Producer) -> None:
            try:
                for rollout in producer.rollouts(group, idle_timeout=idle_timeout, **kwargs):
                    merged.put(rollout)
                    if stop.is_set():
                        return
            except BaseException as exc:  # handed to the consuming thread
                merged.put(exc)
            finally:
                merged.put(_END)

        threads = [
            threading.Thread(target=drain, args=(p,), daemon=True, name=f"rollq-shard-{i}")
            for i, p in enumerate(self.producers)
        ]
        for thread in threads:
            thread.start()
        delivered = Delivered()
        running = len(threads)
        try:
            while running:
                item = merged.get()
                if item is _END:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                elif delivered.first(item):
                    yield item
        finally:
            stop.set()
